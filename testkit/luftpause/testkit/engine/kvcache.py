"""The KV block pool with its prefix cache.

Pure module: no I/O. Theory of operation (vLLM's and SGLang's designs, counted rather than
addressed):
- the pool has `total` blocks; each block is free, private to one request, or cached under a
  prefix key (a hash chain over the tokens of a prefix segment and everything before it). A key
  covers `size` blocks: one block where the engine caches whole blocks (vLLM), a whole message
  where it caches messages (a radix tree cut at message boundaries); see `tokens.prefix_keys`;
- a cached entry is refcounted by the running requests that use it; at refcount 0 it stays
  cached but becomes evictable;
- a request asks for its prefix hits plus `n_new` private blocks; when there are too few free
  blocks, evictable entries are evicted whole, in the cache's eviction order: `lru`, least
  recently released first (a request releases its entries tail first, so the tail of a prefix
  goes before its head), or `fifo`, least recently cached first whatever its use since. A
  referenced entry is never evicted;
- a request publishes its private blocks under keys once their tokens are known (its prompt at
  admission, its reply at the end), and releases all it holds when it leaves. A request may
  take more private blocks while it runs (a reply that grows block by block).

Invariant: free + private + cached == total (cached counts blocks, not entries).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence
from typing import Literal

Eviction = Literal["lru", "fifo"]
EVICTIONS: tuple[Eviction, ...] = ("lru", "fifo")


class PrefixCache:
    """Block accounting for one engine's KV pool."""

    def __init__(self, total_blocks: int, eviction: Eviction = "lru") -> None:
        if eviction not in EVICTIONS:
            raise ValueError("eviction must be lru or fifo")
        self.total = total_blocks
        self.free = total_blocks
        self.private = 0
        self.cached = 0  # blocks held under a key, referenced or not
        self.evictable = 0  # of those, blocks no running request references
        self._fifo = eviction == "fifo"
        self._refs: dict[int, int] = {}
        self._size: dict[int, int] = {}
        # lru: the unreferenced keys, least recently released first. fifo: (seq, key) of the
        # unreferenced keys by the order they were cached in, a min-heap (a key is pushed each
        # time it becomes unreferenced; entries of keys referenced or evicted since are
        # skipped when they come up, so an eviction never walks past the referenced ones).
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._seq: dict[int, int] = {}
        self._heap: list[tuple[int, int]] = []
        self._next = 0

    @property
    def used(self) -> int:
        """Blocks held by running requests (private or referenced)."""
        return self.total - self.free - self.evictable

    def refcount(self, key: int) -> int:
        """References to a cached entry; -1 when `key` is not cached."""
        return self._refs.get(key, -1)

    def size(self, key: int) -> int:
        """Blocks a cached entry covers (0 when `key` is not cached)."""
        return self._size.get(key, 0)

    def match(self, keys: Sequence[int]) -> int:
        """How many of `keys`, from the first, are cached."""
        n = 0
        refs = self._refs
        for key in keys:
            if key not in refs:
                break
            n += 1
        return n

    def room(self, hits: Sequence[int] = ()) -> int:
        """Fresh blocks there are room for once `hits` (cached) are referenced."""
        pinned = sum(self._size[key] for key in hits if self._refs[key] == 0)
        return self.free + self.evictable - pinned

    def can_allocate(self, hits: Sequence[int], n_new: int) -> bool:
        """Whether `hits` (cached) plus `n_new` fresh blocks fit right now."""
        return self.room(hits) >= n_new

    def allocate(self, hits: Sequence[int], n_new: int) -> None:
        """Reference `hits` and take `n_new` private blocks, evicting entries if needed."""
        if not self.can_allocate(hits, n_new):
            raise ValueError("not enough KV blocks")
        for key in hits:
            self._ref(key)
        while self.free < n_new:
            self._evict_one()
        self.free -= n_new
        self.private += n_new

    def publish(self, keys: Sequence[int], sizes: Sequence[int] | None = None) -> None:
        """Turn private blocks into cached entries the caller references: one entry per key,
        of `sizes[i]` blocks (one each when not given)."""
        total = len(keys) if sizes is None else sum(sizes)
        if total > self.private:
            raise ValueError("publishing more blocks than are private")
        for i, key in enumerate(keys):
            size = 1 if sizes is None else sizes[i]
            self.private -= size
            if key in self._refs:  # someone computed it too; keep theirs, free ours
                self._ref(key)
                self.free += size
            else:
                self._refs[key] = 1
                self._size[key] = size
                self.cached += size
                if self._fifo:
                    self._seq[key] = self._next
                    self._next += 1

    def release(self, keys: Sequence[int], n_private: int) -> None:
        """Drop the caller's references (tail first) and free its private blocks."""
        for key in reversed(keys):
            refs = self._refs[key] - 1
            self._refs[key] = refs
            if refs == 0:
                self.evictable += self._size[key]
                if self._fifo:
                    heapq.heappush(self._heap, (self._seq[key], key))
                else:
                    self._lru[key] = None
        if self._fifo and len(self._heap) > 2 * len(self._refs) + 64:
            self._compact()
        self.private -= n_private
        self.free += n_private

    def drop_unreferenced(self) -> None:
        """Evict every evictable entry (a cache reset)."""
        for key in [k for k, refs in self._refs.items() if refs == 0]:
            self._drop(key)
        self._lru.clear()
        self._heap.clear()

    def _evict_one(self) -> None:
        if not self._fifo:
            key, _ = self._lru.popitem(last=False)
            self._drop(key)
            return
        while self._heap:
            seq, key = heapq.heappop(self._heap)
            if self._seq.get(key) == seq and self._refs[key] == 0:
                self._drop(key)
                return
        raise ValueError("nothing evictable")

    def _compact(self) -> None:
        """The fifo heap again from the unreferenced keys alone (it collects an entry per
        release of a key referenced again since)."""
        self._heap = [(self._seq[k], k) for k, refs in self._refs.items() if refs == 0]
        heapq.heapify(self._heap)

    def _drop(self, key: int) -> None:
        size = self._size.pop(key)
        del self._refs[key]
        self._seq.pop(key, None)
        self._lru.pop(key, None)
        self.cached -= size
        self.evictable -= size
        self.free += size

    def _ref(self, key: int) -> None:
        refs = self._refs[key]
        if refs == 0:
            self.evictable -= self._size[key]
            if not self._fifo:
                del self._lru[key]
        self._refs[key] = refs + 1
