#!/bin/sh
# Runs a command at the lowest CPU priority, for a session of its own (setsid scripts/lowest-priority.sh CMD...).
# Where the kernel groups processes by session (CONFIG_SCHED_AUTOGROUP, on in Debian's and most kernels:
# /proc/sys/kernel/sched_autogroup_enabled), a new session is a scheduling group of its own and nice
# ranks a process only inside its group: `setsid nice -n 19` alone took a core's fair share beside two
# busy processes of another session (3.8 CPU s of 4, where theirs got 2.0 and 2.3; with the group's own
# nice 19 it got 0.35). So the session's group gets nice 19 too. A kernel without autogroups has no
# /proc/self/autogroup, and nice alone ranks it there.
{ echo 19 > /proc/self/autogroup; } 2>/dev/null
exec nice -n 19 "$@"
