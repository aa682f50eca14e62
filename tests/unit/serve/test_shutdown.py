"""A service's main thread waiting for SIGTERM stops even when the kernel hands the signal to another thread."""
import subprocess
import sys
import textwrap

from tests.conftest import ROOT

WAITER = textwrap.dedent("""
    import signal, threading, time
    from s2t.serve.shutdown import stop_on_signals, wait_for_stop

    stop, waiting = stop_on_signals(), threading.Event()

    def signal_this_thread():
        waiting.wait()
        time.sleep(0.1)  # the main thread is blocked in its wait by then
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    threading.Thread(target=signal_this_thread, daemon=True).start()
    waiting.set()
    wait_for_stop(stop)
    print("stopped")
""")


def test_a_sigterm_delivered_to_another_thread_still_stops_the_wait():
    done = subprocess.run([sys.executable, "-c", WAITER], cwd=ROOT, capture_output=True, text=True, timeout=20)
    assert done.returncode == 0 and done.stdout.strip() == "stopped", done.stderr
