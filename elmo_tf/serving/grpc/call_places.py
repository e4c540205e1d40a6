"""The places of the gRPC front's open calls (`grpc_front`): calls waiting for their request message and calls at
work, bounded per connection (`CONNECTION_SHARE`), per peer address (`ADDRESS_SHARE`) and in all; past a share of the
waiting places the call that has waited longest gives its place up (issue 49), past one of the working places a call
is refused (RESOURCE_EXHAUSTED naming the share). The front's module docstring tells why.
"""

import asyncio
import collections

# the shares of the places that one connection and one peer address may hold (issue 38: 1,045 calls that never sent
# their request, from 11 connections of one address, held every waiting place and the server refused everyone else).
# Past a share of the working places a call is refused; past a share of the waiting places (or the total), the call of
# that connection or address that has waited longest gives its place up (issue 49: `CallPlaces.wait`)
CONNECTION_SHARE = {"waiting": 0.25, "working": 0.5}
ADDRESS_SHARE = {"waiting": 0.5, "working": 0.75}


def peer_address(peer):
    """The client address of a gRPC peer string without its port: "ipv4:127.0.0.1:5000" -> "ipv4:127.0.0.1",
    "ipv6:[::1]:5000" -> "ipv6:[::1]"; a UNIX socket's peer ("unix:...") is its own address."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6") and ":" in rest:
        return f"{kind}:{rest.rsplit(':', 1)[0]}"
    return peer


def _share(total, kind, shares):
    return max(1, int(total * shares[kind]))


class CallPlaces:
    """The open calls' places, counted on the event loop's thread: `waiting` calls whose request message has not arrived
    (at most `max_waiting`, each for at most `timeout` seconds: `wait`), `working` calls whose work is on the thread
    pool (at most `max_working`, until that work has ended: `grpc_front._Servicer._call`). Of each kind, one connection
    (a gRPC peer: address and port) holds at most `CONNECTION_SHARE` and one address (all its connections) at most
    `ADDRESS_SHARE`, so that one client cannot take them all.

    Past a bound of the working places a call is refused at once (RESOURCE_EXHAUSTED naming the share it met). The
    waiting places never refuse a newcomer, whose message may well have come with its headers (issue 49): the call
    that has waited longest in the group that the newcomer overfills gives its place up instead (`wait`), as
    slow-client defences drop the slowest. Calls that never send fill the waiting places only, never the working ones.
    """

    def __init__(self, max_waiting, max_working, timeout):
        self.max_waiting, self.max_working, self.timeout = max_waiting, max_working, timeout
        self.most_waiting = 0  # the most calls ever waiting at once (never above max_waiting)
        self._working = 0
        self._held = {"connection": collections.Counter(), "address": collections.Counter()}  # working places
        # waiting calls in the order they came (dicts keep it), in all and per connection and per address
        self._queue = {}
        self._waiting = {"connection": {}, "address": {}}
        self._sizes = {}  # n -> {address: None} of the addresses with n waiting calls, in the order they reached n

    @property
    def waiting(self):
        return len(self._queue)

    @property
    def working(self):
        return self._working

    @staticmethod
    def _keys(peer):
        return (("connection", peer, CONNECTION_SHARE), ("address", peer_address(peer), ADDRESS_SHARE))

    def refusal(self, peer):
        """Why a call of `peer` may not take a working place now (the limit it meets), or None."""
        total = self.max_working
        if self._working >= total:
            return "Concurrent RPC limit exceeded!"  # stock's message for its own call cap
        for whose, key, shares in self._keys(peer):
            share = _share(total, "working", shares)
            if self._held[whose][key] >= share:
                return (
                    f"too many calls at work from this {whose} ({share}, {shares['working']:.0%} of the server's "
                    f"{total}): a client's share of the places is bounded"
                )
        return None

    def take(self, peer):
        self._working += 1
        for whose, key, _ in self._keys(peer):
            self._held[whose][key] += 1

    def release(self, peer):
        self._working -= 1
        for whose, key, _ in self._keys(peer):
            held = self._held[whose]
            held[key] -= 1
            if not held[key]:
                del held[key]

    def wait(self, call):
        """Gives `call` (a `Waiting`) a waiting place, never refusing it. Where that puts its connection past its
        share, else its address past its share, else the server past `max_waiting`, the call that has waited longest
        in that group (for the server: in the address holding the most waiting calls, of several the first to hold
        that many) gives its place up: `evict(reason)` is called on it. A call whose read has ended (`done_waiting()`:
        its message is in hand) is not waiting: it leaves its place without being evicted, and the next oldest is
        looked at. The newcomer is the newest of every group, and every share is at least 1, so it is never the one
        evicted. Cost: O(1) per call, but for the number of distinct counts the addresses hold."""
        self._queue[call] = None
        for whose, key, _ in self._keys(call.peer):
            group = self._waiting[whose].setdefault(key, {})
            group[call] = None
            if whose == "address":
                self._resize(key, len(group) - 1, len(group))
        while True:
            victim, reason = self._overfilled(call)
            if victim is None:
                break
            self.leave(victim)
            if not victim.done_waiting():
                victim.evict(reason)
        self.most_waiting = max(self.most_waiting, len(self._queue))

    def _overfilled(self, call):
        """(the call that has waited longest in the first group that `call` overfills, the reason), or (None, None)."""
        for whose, key, shares in self._keys(call.peer):
            group = self._waiting[whose][key]
            share = _share(self.max_waiting, "waiting", shares)
            if len(group) > share:
                return next(iter(group)), (
                    f"request message not received: of the calls waiting for theirs from this {whose} ({share}, "
                    f"{shares['waiting']:.0%} of the server's {self.max_waiting}), this one had waited longest, and "
                    f"gave its place to a newer call: a client's share of the places is bounded"
                )
        if len(self._queue) <= self.max_waiting:
            return None, None
        most = max(self._sizes)  # at most ~sqrt(2 x max_waiting) sizes: cheap for any number of addresses
        victim = next(iter(self._waiting["address"][next(iter(self._sizes[most]))]))
        return victim, (
            f"request message not received: the server's {self.max_waiting} places for calls waiting for their "
            f"request message were full, and this one had waited longest in the address holding the most ({most}), "
            f"and gave its place to a newer call"
        )

    def leave(self, call):
        """Frees `call`'s waiting place (nothing if it holds none: evicted, or left already)."""
        if call not in self._queue:
            return
        del self._queue[call]
        for whose, key, _ in self._keys(call.peer):
            group = self._waiting[whose][key]
            del group[call]
            if whose == "address":
                self._resize(key, len(group) + 1, len(group))
            if not group:
                del self._waiting[whose][key]

    def _resize(self, address, before, after):
        if before:
            addresses = self._sizes[before]
            del addresses[address]
            if not addresses:
                del self._sizes[before]
        if after:
            self._sizes.setdefault(after, {})[address] = None


class Waiting:
    """A call waiting for its request message: its `peer`, the read of its message (`read`, an asyncio task), and
    `evicted` (a future whose result is the reason, set by `evict`)."""

    __slots__ = ("peer", "read", "evicted")

    def __init__(self, peer, read):
        self.peer, self.read = peer, read
        self.evicted = asyncio.get_running_loop().create_future()

    def done_waiting(self):
        return self.read.done()

    def evict(self, reason):
        if not self.evicted.done():
            self.evicted.set_result(reason)
