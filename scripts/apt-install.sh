# Sourced by scripts/install-*.sh. `apt_install WHAT PACKAGE...` installs Debian packages, as
# root, with apt-get; where it cannot, it calls the caller's `say` (which prints why and exits 0)
# with WHAT (what is missing) and the reason.
apt_install() {
    local what=$1
    shift
    [ "$EUID" -eq 0 ] || say "$what: installing $* needs root (uid is $EUID)"
    command -v apt-get >/dev/null 2>&1 || say "$what: there is no apt-get to install $*"
    local log
    log=$(mktemp)
    # The package lists are refreshed only when the install fails without them (that is slow).
    if ! _apt_get_install "$log" "$@"; then
        timeout 300 apt-get update -q >>"$log" 2>&1 || say "apt-get update failed: $(tail -n 1 "$log")"
        _apt_get_install "$log" "$@" || say "apt-get install $* failed: $(tail -n 1 "$log")"
    fi
    rm -f "$log"
}

_apt_get_install() {
    local log=$1
    shift
    DEBIAN_FRONTEND=noninteractive timeout 600 \
        apt-get install -y -q --no-install-recommends "$@" >>"$log" 2>&1
}
