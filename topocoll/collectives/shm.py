"""A shared-memory transport for ranks on one host (the ``shm`` links of a topology).

Through gloo, a message between two processes of one host crosses loopback TCP: a copy into the
kernel, a copy out, and a wake-up per socket buffer. Here the sender copies the data once into
a shared-memory file it owns for that peer and rings a *doorbell* (generation, offset, length);
the receiver copies the data out of the mapping, or reduces straight from it
(:meth:`ShmTransport.recv_apply`). When every rank of the group shares memory, each rank also
has a *mailbox*: a mapped page set where it publishes its doorbells and the per-collective
argument header (:meth:`ShmTransport.exchange_header`) for the others to poll, so nothing goes
through gloo at all; otherwise doorbells go through the inner gloo group.

Each ordered pair (sender, receiver) has one file (an *arena*) that holds every message of one
program to that peer at its own offset, so nothing is overwritten while a program runs.
:meth:`ShmTransport.begin_program` sizes it (a larger *generation* replaces a small one) and
starts again at offset 0; its caller guarantees that every peer has finished reading the
previous program's messages (the backend's argument-header exchange before every collective is
such a point: a rank sends its header only after its previous collective completed). There are
therefore no acknowledgements.

The receiver unlinks a file as soon as it has mapped it, so nothing stays in the shared-memory
directory in normal operation; the sender unlinks arenas it replaces or still owns at
:meth:`ShmTransport.close`. A sender's collective completes when its data is written, perhaps
before the receiver has opened the file, so :meth:`ShmTransport.close` first waits for the
receivers of such files to take them (or to die, or to post a failure).

Which peers share memory is probed, not assumed: every rank writes a token file, and a pair
uses shared memory only when both ranks read each other's token. Other peers go through gloo.
When an arena cannot be allocated (a full shared-memory directory), that program's messages to
the peer go through gloo after a doorbell saying so. Point-to-point calls have the signatures of torch's ``send`` / ``recv``, so the executor runs
unchanged over this transport.
"""

from __future__ import annotations

import logging
import mmap
import os
import platform
import secrets
import struct
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from topocoll.collectives.failure import Failure, FailedError, FailureKind
from topocoll.errors import CollectiveError

__all__ = ["ShmTransport", "SHM_DIRECTORY"]

logger = logging.getLogger(__name__)

SHM_DIRECTORY = "/dev/shm"
"""Where Linux keeps POSIX shared memory (a tmpfs)."""

GLOO_DATA_TAG_BIT = 1 << 30
"""Data that follows a doorbell through gloo carries the message's tag plus this bit (schedule
tags count the messages of one pair in one program and stay far below it)."""

_ALIGN_BYTES = 64
"""Messages start on cache-line boundaries inside an arena."""

_SLOT_BYTES = 128
"""One mailbox slot: sequence number, up to 14 header words, checksum."""

_STATUS_FAILURE_WORD = 0
"""The status slot (the first of a mailbox) starts with the rank's failure record: collective
number (0 while healthy), origin, culprit, kind, checksum (:meth:`ShmTransport.post_failure`)."""

_STATUS_HEARTBEAT_WORD = 8
"""A counter the rank bumps at every look while it waits for a peer: a waiting rank's counter
moves, a dead or busy one's does not (:meth:`ShmTransport.silent_peers`)."""

_STATUS_DONE_WORD = 9
"""The number of the last collective the rank completed."""

_HEADER_SLOTS_AT = _SLOT_BYTES
"""Byte offset of the two header slots (after the status slot)."""

_BELLS_AT = 3 * _SLOT_BYTES
"""Byte offset of the doorbells (after the status slot and the two header slots)."""

_BELL_SLOTS = 256
"""Doorbell slots per peer in a mailbox: a program whose messages between a pair outnumber them
rings that pair's doorbells through gloo instead (both ends decide alike from the program)."""

_BELL_BYTES = 64
"""One doorbell: program number, tag, arena generation, offset, length, checksum."""


_STORES_IN_ORDER = platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")
"""A doorbell written after the data must not become visible before it. x86 keeps stores in
program order (total store order); elsewhere (e.g. Arm) Python offers no fence, so doorbells go
through gloo, whose socket calls order them."""


def _mailbox_bytes(size: int) -> int:
    """A status slot, two header slots (see :meth:`ShmTransport.exchange_header`) and every
    peer's doorbells."""
    return _BELLS_AT + size * _BELL_SLOTS * _BELL_BYTES

_POLL_MIN_S = 20e-6
_POLL_MAX_S = 200e-6
"""Polling a mailbox backs off from 20 us to 200 us between looks, so that waiting ranks leave
the cores to the ones still computing (measured on 4 ranks over 2 cores: a 1 ms ceiling cost
about 1 ms per collective in oversleeping)."""


_CLOSE_POLL_MAX_S = 10e-3
"""Closing polls for receivers up to every 10 ms: one poll per time slice of a busy core."""


def _pid_namespace() -> str:
    """An id of this process's pid namespace: pids of peers mean something only within one."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "unknown"


class _Arena:
    """One memory-mapped file."""

    def __init__(self, path: str, size_bytes: int, create: bool) -> None:
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                try:
                    os.posix_fallocate(fd, 0, size_bytes)  # fail now, not with SIGBUS on a write
                except OSError as exc:
                    os.unlink(path)
                    raise CollectiveError(
                        f"cannot reserve {size_bytes} bytes of shared memory in {os.path.dirname(path)}: {exc}"
                    ) from exc
            else:
                size_bytes = os.fstat(fd).st_size
            self._map = mmap.mmap(fd, size_bytes)
        finally:
            os.close(fd)
        self.path = path
        self.size_bytes = size_bytes
        self.tensor = torch.frombuffer(self._map, dtype=torch.uint8)

    def write_words(self, offset: int, words: list[int]) -> None:
        """Store little-endian int64 ``words`` at byte ``offset``."""
        self._map[offset : offset + 8 * len(words)] = struct.pack(f"<{len(words)}q", *words)

    def read_words(self, offset: int, count: int) -> list[int]:
        """Load ``count`` little-endian int64 words from byte ``offset``."""
        return list(struct.unpack_from(f"<{count}q", self._map, offset))

    def close(self) -> None:
        del self.tensor
        self._map.close()

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass  # the receiver already did


def _checksum(seq: int, values: list[int]) -> int:
    """A word that changes with every field of a mailbox slot (guards against torn reads)."""
    total = seq * 0x9E3779B1
    for index, value in enumerate(values):
        total = (total * 31 + value + index) & 0x7FFFFFFFFFFFFFFF
    return total


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class _SendWork:
    def __init__(self, works: tuple[Any, ...], doorbell: torch.Tensor) -> None:
        self._works = works
        self._doorbell = doorbell  # gloo reads it until the works complete

    def wait(self, timeout: timedelta | None = None) -> bool:
        for work in self._works:
            work.wait(timeout) if timeout is not None else work.wait()
        return True


class _RecvWork:
    """A receive: wait for the doorbell (``ring(timeout)`` returns it), then take the data."""

    def __init__(
        self,
        transport: "ShmTransport",
        ring: Callable[[timedelta | None], torch.Tensor],
        target: torch.Tensor,
        src: int,
        tag: int,
        apply: Callable[[torch.Tensor, torch.Tensor], None] | None,
    ) -> None:
        self._transport = transport
        self._ring = ring
        self._target = target
        self._src = src
        self._tag = tag
        self._apply = apply

    def wait(self, timeout: timedelta | None = None) -> bool:
        doorbell = self._ring(timeout)
        self._transport._deliver(doorbell, self._target, self._src, self._tag, self._apply)
        return True


class ShmTransport:
    """``send`` / ``recv`` through shared memory for peers on this host, gloo for the others.

    Parameters
    ----------
    inner : ProcessGroupGloo
        Carries doorbells, and whole messages to peers without shared memory.
    rank, size : int
        This rank and the group size.
    store : torch.distributed.Store
        A store private to the group (for the probe).
    timeout : datetime.timedelta
        How long to wait for data that follows a doorbell through gloo.
    directory : str
        The shared-memory directory.
    """

    def __init__(self, inner: Any, rank: int, size: int, store: Any, timeout: timedelta, directory: str = SHM_DIRECTORY) -> None:
        self._inner = inner
        self._rank = rank
        self._size = size
        self._timeout = timeout
        self._directory = directory
        self._outgoing: dict[int, _Arena] = {}
        self._generation: dict[int, int] = {}
        self._cursor: dict[int, int] = {}
        self._incoming: dict[int, tuple[int, _Arena]] = {}
        self._through_gloo: set[int] = set()
        self._token = secrets.token_hex(8)
        self._peer_pids: dict[int, int] = {}  # of peers in this rank's pid namespace
        self._prefix = self._agree_prefix(store)
        self._mailbox: _Arena | None = None
        self._peer_mailboxes: dict[int, _Arena] = {}
        self._program = 0
        self._heartbeat = 0
        self._bells_to: set[int] = set()
        self._bells_from: set[int] = set()
        try:
            try:
                self._mailbox = _Arena(self._mail_path(rank), _mailbox_bytes(size), create=True)
            except (OSError, CollectiveError) as exc:
                logger.debug("rank %d: no shared-memory mailbox (%s)", rank, exc)
            self.peers = self._probe(store)
            self._peer_mailboxes = self._map_mailboxes(store)
        except BaseException:
            # a peer died or timed out during set-up: leave nothing behind
            self.close()
            raise

    # ------------------------------------------------------------------ setup
    def _agree_prefix(self, store: Any) -> str:
        if self._rank == 0:
            store.set("shm/group", secrets.token_hex(8))
        group = store.get("shm/group").decode()
        return f"topocoll-{group}"

    def _path(self, src: int, dst: int, generation: int) -> str:
        return os.path.join(self._directory, f"{self._prefix}-{src}-{dst}-{generation}")

    def _mail_path(self, rank: int) -> str:
        return os.path.join(self._directory, f"{self._prefix}-mail-{rank}")

    def _map_mailboxes(self, store: Any) -> dict[int, _Arena]:
        """Map every peer's mailbox (all or none), then remove the files."""
        mapped: dict[int, _Arena] = {}
        everyone = self._mailbox is not None and len(self.peers) == self._size - 1
        if everyone:
            try:
                for peer in self.peers:
                    mapped[peer] = _Arena(self._mail_path(peer), 0, create=False)
            except OSError as exc:
                logger.debug("rank %d: cannot map a peer's mailbox (%s)", self._rank, exc)
                everyone = False
        store.set(f"shm/mail/{self._rank}", "1" if everyone else "0")
        agreed = everyone
        for peer in range(self._size):
            if peer != self._rank and store.get(f"shm/mail/{peer}").decode() != "1":
                agreed = False
        if self._mailbox is not None:
            self._mailbox.unlink()  # every peer has mapped it (or gave up): the name can go
        if not agreed:
            for arena in mapped.values():
                arena.close()
            return {}
        return mapped

    @property
    def has_mailboxes(self) -> bool:
        """Whether :meth:`exchange_header` works (every rank of the group shares memory)."""
        return bool(self._peer_mailboxes) or (self._size == 1)

    def exchange_header(self, sequence: int, values: list[int], timeout: timedelta) -> list[list[int]]:
        """Every rank's ``values`` (same length on all) for collective ``sequence``, through the
        shared-memory mailboxes.

        Each rank publishes its header for collective number ``k`` in header slot ``k % 2`` of
        its mailbox: the sequence number, the values and a checksum, so that a reader never
        accepts a half-written slot whatever order the stores become visible in, nor the header
        of another collective. Two slots suffice because a rank publishes header ``k + 1`` only
        after it has read every peer's header ``k``, so no peer is ever two headers ahead of a
        reader.

        Raises
        ------
        FailedError
            A peer did not publish its header within ``timeout`` (kind ``ABSENT``), or a peer
            has posted a failure record (that record).
        """
        words = [sequence, *values, _checksum(sequence, values)]
        slot = _HEADER_SLOTS_AT + (sequence % 2) * _SLOT_BYTES
        assert self._mailbox is not None
        self._mailbox.write_words(slot, words)
        gathered: list[list[int] | None] = [None] * self._size
        gathered[self._rank] = list(values)
        deadline = time.monotonic() + timeout.total_seconds()
        waiting = [p for p in range(self._size) if p != self._rank]
        pause = _POLL_MIN_S
        while waiting:
            still = []
            for peer in waiting:
                got = self._peer_mailboxes[peer].read_words(slot, len(words))
                if got[0] == sequence and got[-1] == _checksum(sequence, got[1:-1]):
                    gathered[peer] = got[1:-1]
                else:
                    still.append(peer)
            waiting = still
            if not waiting:
                break
            self._raise_posted_failure(waiting)
            if time.monotonic() > deadline:
                self._raise_posted_failure(waiting)  # a peer that gave up meanwhile knows more
                detail = f"rank {self._rank} waited {timeout.total_seconds():g} s for rank(s) {waiting}"
                # a peer still waiting in an earlier collective is held up, not the cause
                silent = [p for p in self.silent_peers(sequence) if p in waiting]
                if silent and silent != waiting:
                    detail += f"; rank(s) {silent} wait for nothing (dead, or busy outside collectives)"
                failure = Failure(sequence, self._rank, (silent or waiting)[0], FailureKind.ABSENT, detail)
                raise FailedError(f"rank {self._rank}: {failure.describe()}", failure)
            self._beat()
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX_S)
        self._raise_posted_failure([])  # a peer that arrived, then failed an earlier wait of this one
        return [g for g in gathered if g is not None]

    # ------------------------------------------------------------------ failures and liveness
    def _beat(self) -> None:
        """Show the peers that this rank is alive and waiting."""
        if self._mailbox is not None:
            self._heartbeat += 1
            self._mailbox.write_words(8 * _STATUS_HEARTBEAT_WORD, [self._heartbeat])

    def mark_done(self, sequence: int) -> None:
        """Record that collective ``sequence`` completed on this rank."""
        if self._mailbox is not None:
            self._mailbox.write_words(8 * _STATUS_DONE_WORD, [sequence])

    def post_failure(self, failure: Failure) -> None:
        """Publish ``failure`` in this rank's mailbox, for every peer's waits to see."""
        if self._mailbox is not None:
            values = [failure.origin, failure.culprit, int(failure.kind)]
            self._mailbox.write_words(
                8 * _STATUS_FAILURE_WORD, [failure.sequence, *values, _checksum(failure.sequence, values)]
            )

    def posted_failure(self, peers: list[int] | None = None) -> Failure | None:
        """The failure record of the first of ``peers`` (default: every peer) that posted one."""
        for peer in self._peer_mailboxes if peers is None else peers:
            words = self._peer_mailboxes[peer].read_words(8 * _STATUS_FAILURE_WORD, 5)
            if words[0] > 0 and words[4] == _checksum(words[0], words[1:4]):
                try:
                    kind = FailureKind(words[3])
                except ValueError:
                    continue  # not a record this version writes
                return Failure(words[0], words[1], words[2], kind)
        return None

    def _raise_posted_failure(self, first: list[int]) -> None:
        """Raise the failure a peer posted, if any (looking at the peers in ``first`` first)."""
        failure = self.posted_failure(list(first) + [p for p in self._peer_mailboxes if p not in first])
        if failure is not None:
            raise FailedError(f"rank {self._rank}: {failure.describe()}", failure)

    def silent_peers(self, sequence: int, listen_s: float = 0.25) -> list[int]:
        """Peers that are inside collective ``sequence`` or before it yet do not wait for anything.

        Watches every peer's heartbeat for ``listen_s`` seconds (bumping this rank's own, so that
        peers running the same check see it alive): a waiting rank bumps its counter every few
        hundred microseconds, a dead rank or one busy outside the collective does not. Peers that
        completed the collective, or posted a failure, are not counted. The default is well
        above the longest pause of a live rank between two looks here (one reduction of a
        large message, a few scheduler time slices) and short against any process-group timeout.
        """
        def beats() -> dict[int, int]:
            return {p: m.read_words(8 * _STATUS_HEARTBEAT_WORD, 1)[0] for p, m in self._peer_mailboxes.items()}

        before = beats()
        end = time.monotonic() + listen_s
        while time.monotonic() < end:
            self._beat()
            time.sleep(_POLL_MAX_S)
        after = beats()
        silent = []
        for peer, count in after.items():
            done = self._peer_mailboxes[peer].read_words(8 * _STATUS_DONE_WORD, 1)[0]
            if count == before[peer] and done < sequence and self.posted_failure([peer]) is None:
                silent.append(peer)
        return sorted(silent)

    def _probe(self, store: Any) -> frozenset[int]:
        """The peers that can map this rank's files and whose files this rank can map."""
        probe = os.path.join(self._directory, f"{self._prefix}-probe-{self._rank}")
        readable: set[int] = set()
        wrote = False
        try:
            with open(probe, "x") as f:
                f.write(f"{self._token} {os.getpid()} {_pid_namespace()}")
            wrote = True
        except OSError as exc:
            logger.debug("rank %d: no shared memory (%s)", self._rank, exc)
        store.set(f"shm/token/{self._rank}", self._token if wrote else "")
        for peer in range(self._size):
            if peer == self._rank:
                continue
            token = store.get(f"shm/token/{peer}").decode()
            try:
                with open(os.path.join(self._directory, f"{self._prefix}-probe-{peer}")) as f:
                    fields = f.read().split()
            except OSError:
                continue
            if token and fields[:1] == [token]:
                readable.add(peer)
                if len(fields) == 3 and fields[2] == _pid_namespace():
                    self._peer_pids[peer] = int(fields[1])
        store.set(f"shm/sees/{self._rank}", ",".join(str(p) for p in sorted(readable)))
        mutual = set()
        for peer in readable:
            seen_by_peer = store.get(f"shm/sees/{peer}").decode()
            if str(self._rank) in seen_by_peer.split(","):
                mutual.add(peer)
        for peer in range(self._size):  # everyone has read every probe: remove ours
            if peer != self._rank:
                store.get(f"shm/sees/{peer}")
        if wrote:
            os.unlink(probe)
        return frozenset(mutual)

    @property
    def progresses_alone(self) -> bool:
        """Whether every posted receive takes its data without ``wait()`` being called, as gloo's
        do (data-flow order relies on it): only when no peer shares memory with this rank. A
        shared-memory receive copies its data in ``wait()``, and one whose sender had no room
        posts its gloo receive only then, so a sender waiting for that send could wait forever."""
        return not self.peers

    # ------------------------------------------------------------------ sending
    def begin_program(self, messages: list[tuple[int, int]], incoming: list[int] | None = None, sequence: int | None = None) -> None:
        """Make each peer's arena hold every message of the coming program and start at offset 0.

        Parameters
        ----------
        messages : list of (peer, size_bytes)
            All sends of the program. Every peer must have finished reading the messages of the
            previous program (see the module docstring).
        incoming : list of int, optional
            The source of every receive of the program. With it (and mailboxes), doorbells of
            pairs with at most ``_BELL_SLOTS`` messages go through shared memory too.
        sequence : int, optional
            The group's number of the collective this program runs (default: one more than the
            last). Every doorbell carries it and a receiver accepts only its own collective's.
        """
        self._program = self._program + 1 if sequence is None else sequence
        self._bells_to, self._bells_from = set(), set()
        if self._peer_mailboxes and incoming is not None and _STORES_IN_ORDER:
            sends: dict[int, int] = {}
            for peer, _ in messages:
                sends[peer] = sends.get(peer, 0) + 1
            recvs: dict[int, int] = {}
            for peer in incoming:
                recvs[peer] = recvs.get(peer, 0) + 1
            self._bells_to = {p for p, n in sends.items() if n <= _BELL_SLOTS and p in self._peer_mailboxes}
            self._bells_from = {p for p, n in recvs.items() if n <= _BELL_SLOTS and p in self._peer_mailboxes}
        needed: dict[int, int] = {}
        for peer, nbytes in messages:
            if peer in self.peers:
                needed[peer] = needed.get(peer, 0) + _round_up(nbytes, _ALIGN_BYTES)
        self._through_gloo = set()
        for peer, nbytes in needed.items():
            arena = self._outgoing.get(peer)
            if arena is None or arena.size_bytes < nbytes:
                try:
                    self._replace(peer, nbytes)
                except CollectiveError as exc:
                    # e.g. a container's small /dev/shm: this program's data to the peer goes
                    # through gloo, announced by a doorbell with generation -1
                    logger.warning("rank %d: %s; sending to rank %d through gloo", self._rank, exc, peer)
                    self._through_gloo.add(peer)
        self._cursor = dict.fromkeys(self._outgoing, 0)

    def _replace(self, peer: int, needed: int) -> None:
        generation = self._generation.get(peer, -1) + 1
        size = 1 << max(needed - 1, _ALIGN_BYTES).bit_length()
        arena = _Arena(self._path(self._rank, peer, generation), size, create=True)
        self._generation[peer] = generation
        old = self._outgoing.get(peer)
        if old is not None:
            old.unlink()
            old.close()
        self._outgoing[peer] = arena

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        """Send ``tensors[0]`` (contiguous) to ``dst`` with ``tag``."""
        if dst not in self.peers:
            return self._inner.send(tensors, dst, tag)
        data = tensors[0].reshape(-1).view(torch.uint8)
        nbytes = data.numel()
        if dst in self._through_gloo:
            data_work = self._inner.send([tensors[0]], dst, tag | GLOO_DATA_TAG_BIT)
            if dst in self._bells_to:
                self._ring(dst, tag, -1, 0, nbytes)
                return _SendWork((data_work,), tensors[0])
            doorbell = torch.tensor([self._program, -1, 0, nbytes], dtype=torch.int64)
            return _SendWork((self._inner.send([doorbell], dst, tag), data_work), doorbell)
        arena = self._outgoing.get(dst)
        offset = self._cursor.get(dst, 0)
        if arena is None or offset + nbytes > arena.size_bytes:
            raise CollectiveError(f"rank {self._rank}: shared-memory arena for rank {dst} too small; begin_program was not called")
        arena.tensor[offset : offset + nbytes].copy_(data)
        self._cursor[dst] = offset + _round_up(nbytes, _ALIGN_BYTES)
        if dst in self._bells_to:
            self._ring(dst, tag, self._generation[dst], offset, nbytes)
            return _SendWork((), data)
        doorbell = torch.tensor([self._program, self._generation[dst], offset, nbytes], dtype=torch.int64)
        return _SendWork((self._inner.send([doorbell], dst, tag),), doorbell)

    # ------------------------------------------------------------------ receiving
    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        """Receive into ``tensors[0]`` (contiguous) from ``src`` with ``tag``."""
        if src not in self.peers:
            return self._inner.recv(tensors, src, tag)
        return _RecvWork(self, self._doorbell_of(src, tag), tensors[0], src, tag, None)

    def recv_apply(
        self, target: torch.Tensor, src: int, tag: int, apply: Callable[[torch.Tensor, torch.Tensor], None]
    ) -> Any | None:
        """Receive from ``src`` and call ``apply(target, data)`` on the data where it lies in shared
        memory (one pass instead of a copy and a reduction); None for peers without shared memory."""
        if src not in self.peers:
            return None
        return _RecvWork(self, self._doorbell_of(src, tag), target, src, tag, apply)

    def _doorbell_of(self, src: int, tag: int) -> Callable[[timedelta | None], torch.Tensor]:
        """How to wait for the doorbell of message ``tag`` from ``src``: its mailbox or gloo."""
        if src in self._bells_from:
            return lambda timeout: self.wait_bell(src, tag, timeout)
        doorbell = torch.empty(4, dtype=torch.int64)
        work = self._inner.recv([doorbell], src, tag)  # posted now, so gloo can match it early
        program = self._program

        def ring(timeout: timedelta | None) -> torch.Tensor:
            work.wait(timeout) if timeout is not None else work.wait()
            if int(doorbell[0]) != program:
                raise CollectiveError(
                    f"rank {self._rank}: message {tag} from rank {src} belongs to collective #{int(doorbell[0])}, "
                    f"this rank runs #{program}: the ranks are out of step"
                )
            return doorbell[1:]

        return ring

    def _bell_offset(self, dst: int, tag: int) -> int:
        return _BELLS_AT + (dst * _BELL_SLOTS + (tag - 1) % _BELL_SLOTS) * _BELL_BYTES

    def _ring(self, dst: int, tag: int, generation: int, offset: int, nbytes: int) -> None:
        """Publish the doorbell of message ``tag`` to ``dst`` in this rank's mailbox."""
        values = [tag, generation, offset, nbytes]
        assert self._mailbox is not None
        self._mailbox.write_words(self._bell_offset(dst, tag), [self._program, *values, _checksum(self._program, values)])

    def wait_bell(self, src: int, tag: int, timeout: timedelta | None) -> torch.Tensor:
        """Poll ``src``'s mailbox until its doorbell for message ``tag`` of this program is there."""
        mailbox = self._peer_mailboxes[src]
        where = self._bell_offset(self._rank, tag)
        limit = (timeout or self._timeout).total_seconds()
        deadline = time.monotonic() + limit
        pause = _POLL_MIN_S
        while True:
            words = mailbox.read_words(where, 6)
            if words[0] == self._program and words[1] == tag and words[5] == _checksum(words[0], words[1:5]):
                return torch.tensor(words[2:5], dtype=torch.int64)
            self._raise_posted_failure([src])
            if time.monotonic() > deadline:
                raise self._silence(src, tag, limit)
            self._beat()
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX_S)

    def _silence(self, src: int, tag: int, limit_s: float) -> FailedError:
        """The error of a wait for ``src`` that timed out, blaming the rank that is really missing."""
        self._raise_posted_failure([src])  # a peer that gave up meanwhile knows more
        silent = self.silent_peers(self._program)
        waited = f"rank {self._rank} waited {limit_s:g} s for message {tag} from rank {src}"
        if src in silent or not silent:
            culprit = src
            detail = waited if silent else f"{waited}, and every rank is still waiting (the ranks disagree on the schedule)"
        else:
            culprit = silent[0]
            detail = f"{waited}; rank(s) {silent} wait for nothing (dead, or busy outside the collective)"
        failure = Failure(self._program, self._rank, culprit, FailureKind.SILENT, detail)
        return FailedError(f"rank {self._rank}: {failure.describe()}", failure)

    def _deliver(
        self,
        doorbell: torch.Tensor,
        target: torch.Tensor,
        src: int,
        tag: int,
        apply: Callable[[torch.Tensor, torch.Tensor], None] | None,
    ) -> None:
        generation, offset, nbytes = (int(v) for v in doorbell.tolist())
        expected = target.numel() * target.element_size()
        if nbytes != expected:
            raise CollectiveError(f"rank {self._rank}: rank {src} sent {nbytes} bytes, expected {expected}")
        if generation < 0:  # the sender had no room in shared memory: the data follows via gloo
            landing = target if apply is None else torch.empty_like(target)
            self._inner.recv([landing], src, tag | GLOO_DATA_TAG_BIT).wait(self._timeout)
            if apply is not None:
                apply(target, landing)
            return
        current = self._incoming.get(src)
        if current is None or current[0] != generation:
            if current is not None:
                current[1].close()
            arena = _Arena(self._path(src, self._rank, generation), 0, create=False)
            arena.unlink()  # both ends have it mapped: nothing left behind
            self._incoming[src] = (generation, arena)
        arena = self._incoming[src][1]
        data = arena.tensor[offset : offset + nbytes]
        if apply is None:
            target.reshape(-1).view(torch.uint8).copy_(data)
        else:
            apply(target, data.view(target.dtype).view(target.shape))


    def close(self, wait_for_receivers: bool = True) -> None:
        """Unmap everything and remove the files this rank still owns, and those a dead peer left
        for it (arenas addressed to this rank, set-up files of a peer that died before removing
        them).

        Parameters
        ----------
        wait_for_receivers : bool
            First wait (up to the timeout) until every peer has opened the arenas this rank
            wrote for it, unless the peer died or posted a failure: the last collective's
            messages may still be on their way. False when the group failed.
        """
        if wait_for_receivers:
            self._await_receivers()
        self._remove_leftovers()
        for arena in self._outgoing.values():
            arena.unlink()
            arena.close()
        self._outgoing.clear()
        for _, arena in self._incoming.values():
            arena.close()
        self._incoming.clear()
        for arena in self._peer_mailboxes.values():
            arena.close()
        self._peer_mailboxes = {}
        if self._mailbox is not None:
            self._mailbox.close()
            self._mailbox = None
        self._inner = None  # the gloo group: its threads and sockets go when its owner lets go

    def _await_receivers(self) -> None:
        """Wait until each arena file still in the directory was opened by its receiver (which
        unlinks it), the receiver died, the receiver posted a failure, or the timeout passed."""
        pending = {peer: arena.path for peer, arena in self._outgoing.items()}
        deadline = time.monotonic() + self._timeout.total_seconds()
        pause = _POLL_MIN_S
        while pending:
            for peer, path in list(pending.items()):
                if not os.path.exists(path) or not self._alive(peer) or (
                    peer in self._peer_mailboxes and self.posted_failure([peer]) is not None
                ):
                    del pending[peer]
            if not pending:
                return
            if time.monotonic() > deadline:
                logger.warning(
                    "rank %d: rank(s) %s did not take their last message within %s; removing it",
                    self._rank, sorted(pending), self._timeout,
                )
                return
            time.sleep(pause)
            pause = min(pause * 2, _CLOSE_POLL_MAX_S)

    def _alive(self, peer: int) -> bool:
        """Whether ``peer``'s process still exists (True when its pid is not known here)."""
        pid = self._peer_pids.get(peer)
        if pid is None:
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True  # exists, owned by another user
        return True

    def _remove_leftovers(self) -> None:
        prefix = getattr(self, "_prefix", None)
        if prefix is None:
            return  # set-up failed before the group agreed on a name: nothing was created
        try:
            names = os.listdir(self._directory)
        except OSError:
            return
        for name in names:
            if not name.startswith(prefix + "-"):
                continue
            parts = name[len(prefix) + 1 :].split("-")
            ours = parts[0] in ("mail", "probe") or (
                len(parts) == 3 and str(self._rank) in (parts[0], parts[1])
            )
            if ours:
                try:
                    os.unlink(os.path.join(self._directory, name))
                except FileNotFoundError:
                    pass  # a peer removed it first
