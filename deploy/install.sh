#!/usr/bin/env bash
# Install tops as a system service: a venv in /opt/tops/venv, the `tops` user, /etc/tops/tops.toml, the systemd
# unit, the Mosquitto drop-in and ACL, the Prometheus rules and the documentation. Run from a checkout, as root:
#     deploy/install.sh                 # then follow the next steps it prints
# PYTHON=/path/to/python3.11 picks the interpreter of the venv; it must be one every user can run (the service runs
# as `tops`), so an interpreter under a home directory only its owner can enter (pyenv in /root) is refused.
# DESTDIR=/some/root installs under that root instead (no user, no systemctl): the tests run it that way.
# TOPS_SITE_PACKAGES=DIR[:DIR] (tests): the venv takes tops's dependencies from those directories instead of PyPI.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
root="${DESTDIR:-}"

say() { printf 'install.sh: %s\n' "$*"; }
refuse() { printf 'install.sh: %s\n' "$*" >&2; exit 2; }

# Every directory from / to the file must be enterable by others, and the file runnable by them.
usable_by_all() {
    local path="$1" dir
    for path in "$1" "$(readlink -f "$1" 2>/dev/null || echo "$1")"; do
        [ -x "$path" ] || return 1
        [ -n "$(find "$path" -maxdepth 0 -perm -o+x 2>/dev/null)" ] || return 1
        dir="$(dirname "$path")"
        while [ "$dir" != "/" ]; do
            [ -n "$(find "$dir" -maxdepth 0 -perm -o+x 2>/dev/null)" ] || return 1
            dir="$(dirname "$dir")"
        done
    done
}

new_enough() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }

if [ -n "${PYTHON:-}" ]; then
    command -v "$PYTHON" >/dev/null 2>&1 || refuse "PYTHON=$PYTHON is not a program"
    python="$(command -v "$PYTHON")"
    new_enough "$python" || refuse "PYTHON=$python is older than Python 3.11"
    usable_by_all "$python" || refuse "PYTHON=$python lies where the tops user cannot run it (a directory only \
its owner can enter); set PYTHON= to an interpreter every user can run, e.g. PYTHON=/usr/bin/python3"
else
    python=""
    for candidate in "$(command -v python3 2>/dev/null || true)" /usr/bin/python3 /usr/local/bin/python3; do
        [ -n "$candidate" ] && [ -x "$candidate" ] || continue
        if new_enough "$candidate" && usable_by_all "$candidate"; then python="$candidate"; break; fi
    done
    [ -n "$python" ] || refuse "no Python 3.11 or newer that every user can run (on Debian 12: apt-get install \
python3 python3-venv); set PYTHON=/path/to/python3.11"
fi
"$python" -c 'import venv, ensurepip' 2>/dev/null || refuse "$python cannot make a venv (on Debian: apt-get install \
python3-venv); or set PYTHON= to another interpreter"
say "using $python ($("$python" -c 'import sys; print(sys.version.split()[0])'))"

install -d -m 0755 "$root/opt/tops" "$root/etc/tops" "$root/etc/systemd/system" "$root/etc/mosquitto/conf.d" \
    "$root/etc/prometheus" "$root/usr/share/doc/tops"
"$python" -m venv "$root/opt/tops/venv"
if [ -n "${TOPS_SITE_PACKAGES:-}" ]; then
    purelib="$("$root/opt/tops/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    tr ':' '\n' <<<"$TOPS_SITE_PACKAGES" > "$purelib/tops-dependencies.pth"
    "$root/opt/tops/venv/bin/python" -m pip install -q --no-deps "$src"
else
    "$root/opt/tops/venv/bin/python" -m pip install -q "$src"
fi
[ -e "$root/etc/tops/tops.toml" ] || install -m 0640 "$src/deploy/tops.toml" "$root/etc/tops/tops.toml"
install -m 0644 "$src/deploy/tops.service" "$root/etc/systemd/system/tops.service"
install -m 0644 "$src/deploy/mosquitto.conf" "$root/etc/mosquitto/conf.d/tops.conf"
install -m 0640 "$src/deploy/mosquitto.acl" "$root/etc/mosquitto/tops.acl"
install -m 0644 "$src/deploy/tops.rules.yml" "$root/etc/prometheus/tops.rules.yml"
install -m 0644 "$src/README.md" "$root/usr/share/doc/tops/README.md"
if [ -d "$src/docs" ]; then cp -r "$src/docs" "$root/usr/share/doc/tops/"; chmod -R u=rwX,go=rX "$root/usr/share/doc/tops"; fi

if [ -z "$root" ]; then
    id tops >/dev/null 2>&1 || useradd --system --home-dir /var/lib/tops --shell /usr/sbin/nologin tops
    chgrp tops /etc/tops/tops.toml
    chgrp mosquitto /etc/mosquitto/tops.acl 2>/dev/null || true
fi
systemd_runs=""
[ -z "$root" ] && [ -d /run/systemd/system ] && systemd_runs=1
[ -n "$systemd_runs" ] && systemctl daemon-reload

say "installed tops in $root/opt/tops/venv. Next steps:"
cat <<EOF
  1. Broker passwords: mosquitto_passwd -c /etc/mosquitto/tops.passwd svc/tops (and one per device, see
     deploy/mosquitto.passwd.example); chown root:mosquitto /etc/mosquitto/tops.passwd; chmod 0640 it.
  2. The daemon's broker password: write it to /etc/tops/mqtt-password, then
     chown tops:tops /etc/tops/mqtt-password && chmod 0600 /etc/tops/mqtt-password
  3. Review /etc/tops/tops.toml (streams, bound, holdout), then check it:
     runuser -u tops -- /opt/tops/venv/bin/tops run --config /etc/tops/tops.toml --check
EOF
if [ -n "$systemd_runs" ]; then
    echo "  4. Start it: systemctl enable --now tops; follow it with journalctl -u tops -f"
else
    cat <<EOF
  4. systemd is not running here (no /run/systemd/system): start the daemon with your init system, as the tops user,
     with its state directory: install -d -o tops -g tops -m 0700 /var/lib/tops, then
     runuser -u tops -- /opt/tops/venv/bin/tops run --config /etc/tops/tops.toml
     (exit code 2 is a configuration refusal: do not restart on it)
EOF
fi
echo "  Documentation: /usr/share/doc/tops/ (docs/index.md) and mkdocs.yml in the checkout"
