"""TLS end to end: a CA and a server certificate made here, Debian's Mosquitto with the stock configuration plus
deploy/mosquitto.conf and deploy/mosquitto-tls.conf; the daemon connects over TLS with the shipped ACL's daemon
account, a device publishes over TLS, releases come out; a daemon that trusts another CA never connects."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import time
from pathlib import Path

import pytest

from tests.support import (
    ACL_USERS,
    DEPLOY,
    MOSQUITTO,
    Broker,
    DaemonProcess,
    Subscriber,
    daemon_config,
    deploy_broker_conf,
    free_port,
    run_tool,
    wait_for,
    wait_port,
)


# -- TLS --------------------------------------------------------------------------------------------------------
def _certs(where: Path, name: str) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 / localhost signed by it (PEM files)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"tops test CA {name}")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    where.mkdir(parents=True, exist_ok=True)
    ca_pem, crt, kpem = where / "ca.crt", where / "server.crt", where / "server.key"
    ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    kpem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    os.chmod(kpem, 0o600)
    return ca_pem, crt, kpem


@pytest.fixture
def tls_broker(tmp_path: Path):
    if not Path(MOSQUITTO).exists():
        pytest.skip("mosquitto is not installed (.ci/run installs it)")
    ca, crt, key = _certs(tmp_path / "certs", "good")
    port, tls_port = free_port(), free_port()
    tls = (DEPLOY / "mosquitto-tls.conf").read_text()
    tls = (tls.replace("listener 8883", f"listener {tls_port} 127.0.0.1")
           .replace("/etc/mosquitto/certs/server.crt", str(crt)).replace("/etc/mosquitto/certs/server.key", str(key))
           .replace("/etc/mosquitto/certs/ca.crt", str(ca)))
    b = Broker(port, deploy_broker_conf(tmp_path / "broker", port, extra_dropins=(tls,)))
    b.start()
    wait_port(tls_port)
    try:
        yield b, tls_port, ca
    finally:
        b.stop()


def _tls_daemon(tmp: Path, port: int, ca: Path) -> DaemonProcess:
    pw = tmp / "mqtt-password"
    pw.write_text(ACL_USERS["svc/tops"] + "\n")
    mport = free_port()
    cfg = daemon_config(tmp, port, mport, streams={"template": {"holdout": 5}},
                        mqtt={"username": "svc/tops", "password_file": str(pw), "tls": True, "ca_file": str(ca),
                              "reconnect_min": 0.2, "reconnect_max": 0.5})
    return DaemonProcess(cfg, mport, tmp)


@pytest.mark.network
@pytest.mark.slow
def test_tls_end_to_end_and_a_wrong_ca_is_refused(tls_broker, tmp_path: Path) -> None:
    broker, tls_port, ca = tls_broker
    out = Subscriber(broker.port, "dp/#", user=("svc/consumer", ACL_USERS["svc/consumer"]))
    good = tmp_path / "good"
    good.mkdir()
    daemon = _tls_daemon(good, tls_port, ca)
    try:
        daemon.wait_connected()
        pub = run_tool(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(tls_port), "--cafile", str(ca), "-u", "meter-a",
                    "-P", ACL_USERS["meter-a"], "-t", "meters/meter-a/reading", "-q", "1", "-l"],
                   input="".join(f"{i % 9}\n" for i in range(20)))
        assert pub.returncode == 0, pub.stderr
        wait_for(lambda: len([p for p in out.payloads() if "tick" in p]) >= 15, 20, what="releases over TLS")
        assert daemon.stop() == 0
    finally:
        out.close()
        daemon.kill()
    bad = tmp_path / "bad"
    bad.mkdir()
    other_ca, _, _ = _certs(tmp_path / "other", "other")
    daemon = _tls_daemon(bad, tls_port, other_ca)
    try:
        wait_for(lambda: "broker connection failed" in daemon.stderr(), 20, what="a refused TLS handshake")
        time.sleep(1.0)
        assert daemon.metrics().get("tops_mqtt_connected") == 0.0
        assert daemon.stop() == 0
    finally:
        daemon.kill()
