"""The KV block pool with its prefix cache.

Pure module: no I/O. Theory of operation (vLLM's design, counted rather than addressed):
- the pool has `total` blocks; each block is free, private to one request, or cached under a
  prefix key (a hash chain over the block's tokens and everything before it);
- a cached block is refcounted by the running requests that use it; at refcount 0 it stays
  cached but becomes evictable, in least-recently-released order;
- a request asks for its prefix hits plus `n_new` private blocks; when there are too few free
  blocks, evictable blocks are evicted oldest first. A referenced block is never evicted;
- a request publishes its private blocks under keys once their tokens are known (its prompt at
  admission, its reply at the end), and releases all it holds when it leaves. A request may
  take more private blocks while it runs (a reply that grows block by block). Blocks are
  released tail first, so the tail of a prefix is evicted before its head.

Invariant: free + private + cached == total.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    """Block accounting for one engine's KV pool."""

    def __init__(self, total_blocks: int) -> None:
        self.total = total_blocks
        self.free = total_blocks
        self.private = 0
        self._refs: dict[int, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()

    @property
    def cached(self) -> int:
        """Blocks held under a key, referenced or not."""
        return len(self._refs)

    @property
    def evictable(self) -> int:
        return len(self._lru)

    @property
    def used(self) -> int:
        """Blocks held by running requests (private or referenced)."""
        return self.total - self.free - len(self._lru)

    def refcount(self, key: int) -> int:
        """References to a cached block; -1 when `key` is not cached."""
        return self._refs.get(key, -1)

    def match(self, keys: Sequence[int]) -> int:
        """Length of the longest prefix of `keys` that is cached."""
        n = 0
        for key in keys:
            if key not in self._refs:
                break
            n += 1
        return n

    def room(self, hits: Sequence[int] = ()) -> int:
        """Fresh blocks there are room for once `hits` (cached) are referenced."""
        pinned = sum(1 for key in hits if self._refs[key] == 0)
        return self.free + len(self._lru) - pinned

    def can_allocate(self, hits: Sequence[int], n_new: int) -> bool:
        """Whether `hits` (cached) plus `n_new` fresh blocks fit right now."""
        return self.room(hits) >= n_new

    def allocate(self, hits: Sequence[int], n_new: int) -> None:
        """Reference `hits` and take `n_new` private blocks, evicting LRU blocks if needed."""
        if not self.can_allocate(hits, n_new):
            raise ValueError("not enough KV blocks")
        for key in hits:
            self._ref(key)
        while self.free < n_new:
            key, _ = self._lru.popitem(last=False)
            del self._refs[key]
            self.free += 1
        self.free -= n_new
        self.private += n_new

    def publish(self, keys: Sequence[int]) -> None:
        """Turn one private block per key into a cached block the caller references."""
        if len(keys) > self.private:
            raise ValueError("publishing more blocks than are private")
        for key in keys:
            self.private -= 1
            if key in self._refs:  # someone computed it too; keep theirs, free ours
                self._ref(key)
                self.free += 1
            else:
                self._refs[key] = 1

    def release(self, keys: Sequence[int], n_private: int) -> None:
        """Drop the caller's references (tail first) and free its private blocks."""
        for key in reversed(keys):
            refs = self._refs[key] - 1
            self._refs[key] = refs
            if refs == 0:
                self._lru[key] = None
        self.private -= n_private
        self.free += n_private

    def drop_unreferenced(self) -> None:
        """Evict every evictable block (a cache reset)."""
        for key in self._lru:
            del self._refs[key]
        self.free += len(self._lru)
        self._lru.clear()

    def _ref(self, key: int) -> None:
        refs = self._refs[key]
        if refs == 0:
            del self._lru[key]
        self._refs[key] = refs + 1
