"""What the broker's persistence settings cost: QoS 1 messages per second into Mosquitto while a
persistent-session subscriber (the daemon's situation while it is down) has them queued, for the stock autosave
(1800 s), deploy/'s autosave every second, and saving on every change. Prints one line per setting.

    python bench/bench_broker.py [--messages 20000]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support import MOSQUITTO, free_port, wait_port

SETTINGS = {
    "stock (autosave_interval 1800)": "autosave_interval 1800\n",
    "deploy/ (autosave_interval 1)": "autosave_interval 1\n",
    "every change (autosave_on_changes, interval 1)": "autosave_on_changes true\nautosave_interval 1\n",
}


def run(extra: str, n: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        port = free_port()
        conf = Path(d) / "m.conf"
        conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
                        f"persistence_location {d}/\nmax_queued_messages 1000000\nuser root\n{extra}")
        broker = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_port(port)
            # a persistent session that is away: every message is queued for it (and persisted)
            subprocess.run(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-t", "m/#", "-q", "1", "-c",
                            "-i", "away", "-E"], check=True, timeout=30)
            data = "".join(f"{i % 97}\n" for i in range(n)).encode()
            t0 = time.perf_counter()
            subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-t", "m/a", "-q", "1", "-l"],
                           input=data, check=True, timeout=600)
            return n / (time.perf_counter() - t0)
        finally:
            broker.terminate()
            broker.wait(10)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--messages", type=int, default=20000)
    args = p.parse_args()
    if not shutil.which("mosquitto_pub"):
        sys.exit("mosquitto-clients is not installed")
    for name, extra in SETTINGS.items():
        print(f"{name:48s} {run(extra, args.messages):10,.0f} QoS 1 msg/s ({args.messages} messages queued)")


if __name__ == "__main__":
    main()
