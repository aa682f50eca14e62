"""The memory of a server's process tree, read from /proc while the bench measures."""
import subprocess
import sys
import time

from s2t.bench.harness.process_tree import PeakRss


def test_the_peak_keeps_sampling_the_other_roots_after_one_has_gone():
    """A root that ends mid-round weighs nothing from then on; the sampling goes on for the rest."""
    short = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    # Grows to about 200 MB once the short one has gone, then waits.
    grows = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.0); b = bytearray(200 * 2**20); "
                              "b[::4096] = b'x' * len(b[::4096]); time.sleep(60)"])
    try:
        peak = PeakRss([short.pid, grows.pid]).start()
        short.wait(timeout=30)
        time.sleep(2.0)
        assert peak._thread.is_alive()
        assert peak.stop() > 150 * 2**20
    finally:
        grows.kill()
        grows.wait(timeout=30)
