"""Text from a job (its log lines, FailureReason) made safe for a terminal before smlaunch prints
it: a script's output must not retitle the window, plant OSC-8 links whose text hides their
target, move the cursor to overwrite earlier lines, or switch the terminal's modes. Colour (SGR,
`ESC[...m`) stays, as do tab, newline and carriage return (progress bars redraw with it); every
other escape sequence (CSI, OSC, DCS, SOS, PM, APC, two-byte escapes) and control character (C0,
DEL, C1) is removed. Pure stdlib."""

from __future__ import annotations

import re

_SGR = re.compile(r"\x1b\[[0-9;:]*m")
_CONTROL = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: cursor moves, erases, modes; SGR is kept below
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: window title, OSC-8 hyperlinks, clipboard
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS, SOS, PM, APC strings
    r"|\x1b[ -/]*[0-~]"  # other escapes (ESC c resets the terminal)
    r"|\x9b[0-?]*[ -/]*[@-~]"  # CSI as one C1 character
    r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\x80-\x9f]"  # control characters, a lone ESC and C1 (\x9b is CSI) too
)


def printable(text: str) -> str:
    """`text` with every escape sequence but colour, and every control character but tab, newline
    and carriage return, removed."""
    return _CONTROL.sub(lambda m: m.group() if _SGR.fullmatch(m.group()) else "", text)


_ANY_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def as_data(text: object) -> str:
    """A name or value someone chose (a metric's, a hyperparameter's) as data: every control character,
    an escape sequence's ESC and colour's too, shown as its `\\xNN` code, so that the terminal prints it
    and does nothing. (Rich markup in it is the printer's to escape: tuneview prints it as rich Text.)"""
    return _ANY_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))
