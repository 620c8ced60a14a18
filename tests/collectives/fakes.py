"""An in-process transport for the executor tests: one thread per rank, a shared mailbox.

It behaves like gloo's point-to-point ops for what the executor relies on, and no better: a send
reads the sender's buffer only when the receiver takes the message (so a rank that overwrote a
range it is still sending would corrupt it), its ``wait()`` returns once the message was taken,
and ``wait()`` raises after a timeout. As in gloo, whose I/O threads receive into posted buffers,
a posted receive takes its message in the background, whether or not its rank calls ``wait()``
yet. Rank ``r`` takes its messages ``r`` x 20 ms late, which makes a corruption show.
"""

from __future__ import annotations

import threading
import time


class _SendWork:
    def __init__(self, taken, key):
        self._taken, self._key = taken, key

    def wait(self, timeout=None):
        if not self._taken.wait(timeout.total_seconds() if timeout else 5.0):
            raise RuntimeError(f"message {self._key} was never received")
        return True


class _RecvWork:
    def __init__(self, box, key, target, delay_s):
        self._box, self._key, self._target, self._delay_s = box, key, target, delay_s
        self._error = None
        self._thread = threading.Thread(target=self._take, daemon=True)
        self._thread.start()

    def _take(self):
        try:
            source, taken = self._box.take(self._key, 5.0)
            time.sleep(self._delay_s)
            if source.numel() != self._target.numel():
                raise RuntimeError(f"message {self._key} has {source.numel()} elements, expected {self._target.numel()}")
            self._target.copy_(source)  # reads the sender's buffer now, not when it was sent
            taken.set()
        except RuntimeError as exc:
            self._error = exc

    def is_completed(self):
        return not self._thread.is_alive()

    def wait(self, timeout=None):
        self._thread.join(timeout.total_seconds() if timeout else 5.0)
        if self._thread.is_alive():
            raise RuntimeError(f"timed out waiting for message {self._key}")
        if self._error is not None:
            raise self._error
        return True


class Mailbox:
    def __init__(self):
        self._messages = {}
        self._cond = threading.Condition()

    def put(self, key, data):
        with self._cond:
            self._messages[key] = data
            self._cond.notify_all()

    def take(self, key, timeout_s):
        with self._cond:
            if not self._cond.wait_for(lambda: key in self._messages, timeout_s):
                raise RuntimeError(f"timed out waiting for message {key}")
            return self._messages.pop(key)


class Transport:
    """torch-like ``send`` / ``recv`` between threads."""

    def __init__(self, box, rank):
        self._box, self._rank = box, rank

    def send(self, tensors, dst, tag):
        taken = threading.Event()
        self._box.put((self._rank, dst, tag), (tensors[0], taken))
        return _SendWork(taken, (self._rank, dst, tag))

    def recv(self, tensors, src, tag):
        return _RecvWork(self._box, (src, self._rank, tag), tensors[0], 0.02 * self._rank)
