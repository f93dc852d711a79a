#!/usr/bin/env bash
# Install tops as a system service: a venv in /opt/tops/venv, the `tops` user, /etc/tops/tops.toml, the systemd
# unit, and the Mosquitto drop-in and ACL. Run from a checkout, as root:
#     sudo deploy/install.sh            # then: edit /etc/tops/tops.toml, set passwords, systemctl enable --now tops
# DESTDIR=/some/root installs under that root instead (no user, no systemctl, no apt): tests/test_deploy.py runs it
# that way and checks the tree it makes.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
root="${DESTDIR:-}"
python="${PYTHON:-python3}"

install -d -m 0755 "$root/opt/tops" "$root/etc/tops" "$root/etc/systemd/system" "$root/etc/mosquitto/conf.d"
if [ -n "${TOPS_USE_SYSTEM_PACKAGES:-}" ]; then  # tests: reuse the installed dependencies, build nothing else
    "$python" -m venv --system-site-packages "$root/opt/tops/venv"
    "$root/opt/tops/venv/bin/pip" install -q --no-deps "$src"
else
    "$python" -m venv "$root/opt/tops/venv"
    "$root/opt/tops/venv/bin/pip" install -q "$src"
fi
[ -e "$root/etc/tops/tops.toml" ] || install -m 0640 "$src/deploy/tops.toml" "$root/etc/tops/tops.toml"
install -m 0644 "$src/deploy/tops.service" "$root/etc/systemd/system/tops.service"
install -m 0644 "$src/deploy/mosquitto.conf" "$root/etc/mosquitto/conf.d/tops.conf"
install -m 0640 "$src/deploy/mosquitto.acl" "$root/etc/mosquitto/tops.acl"
install -d -m 0755 "$root/etc/prometheus"
install -m 0644 "$src/deploy/tops.rules.yml" "$root/etc/prometheus/tops.rules.yml"

if [ -z "$root" ]; then
    id tops >/dev/null 2>&1 || useradd --system --home-dir /var/lib/tops --shell /usr/sbin/nologin tops
    chgrp tops /etc/tops/tops.toml
    chgrp mosquitto /etc/mosquitto/tops.acl 2>/dev/null || true
    systemctl daemon-reload
    echo "installed; next: passwords (deploy/mosquitto.passwd.example), /etc/tops/tops.toml, then"
    echo "    /opt/tops/venv/bin/tops run --config /etc/tops/tops.toml --check && systemctl enable --now tops"
fi
