"""How a request's pages become prefix-cache entries (:class:`Donation`, mixed into
:class:`sim.memory.prefix.PrefixCachingPolicy`): its full prompt pages inside the trace's hash blocks once
computed (or scheduled: paged, vLLM v1), and, where the policy caches them (paged), the rest of its full pages
when it is preempted by recompute, under keys of its own that only its re-admission can match (vLLM v1 caches
every full block of a request's tokens, ``Request.block_hashes``; ``KVCacheManager.free`` leaves them cached).
``self`` is the prefix policy (its ``cache``, ``slot_keys``, ``shared`` and entry methods of
:class:`sim.memory.prefix_entries.PrefixEntries`)."""
from __future__ import annotations

from collections.abc import Sequence


class Donation:
    """Donation of a slot's pages to the cache (module docstring)."""

    def donate(self, slot: int, hash_ids: Sequence[int], prompt_tokens: int, computed_tokens: int) -> int:
        """Turn the slot's next full, private prompt pages into cache entries (in page order; a page another
        request cached meanwhile becomes a copy no lookup reaches). Returns how many pages were donated."""
        per_page = self.config.tokens_per_page
        full_blocks = min(len(hash_ids), prompt_tokens // self.block_tokens)
        pages = full_blocks * self.block_tokens // per_page
        page = self.shared[slot]
        if page >= min(pages, self.mapped[slot]) or (page + 1) * per_page > computed_tokens:
            return 0
        chain = self.block_chain(hash_ids[:full_blocks])
        donated = 0
        while page < min(pages, self.mapped[slot]) and (page + 1) * per_page <= computed_tokens:
            key = self.page_key(chain, page)
            parent = self.page_key(chain, page - 1) if page else None
            if key in self.cache:
                # computed concurrently by another request (two prompts of one prefix in one iteration): vLLM
                # caches this block too (BlockPool.cached_block_hash_to_block holds several blocks per hash) and
                # goes on caching the blocks after it; a lookup finds the first copy, so this one is an entry no
                # lookup reaches (a key of its own), evictable once released, and the chain goes on past it
                # (it stopped here: a later request hit 1,024 of 2,048 tokens, not 2,032: helper-54)
                self._duplicates += 1
                entry = (*key, "copy", self._duplicates)
                self._new_entry(entry, slot, parent, tiered=False)
                self._copies.setdefault(key, []).append(entry)
            else:
                entry = key
                self._new_entry(key, slot, parent)
                self._index_partials(chain, page, key)
            self.slot_keys[slot].append(entry)
            self.shared[slot] += 1
            page += 1
            donated += 1
        return donated

    @property
    def caches_own_pages(self) -> bool:
        """Whether a request preempted by recompute leaves its own full pages cached for its re-admission
        (paged, ``cow_partial`` off: vLLM v1 caches every full block of a request's tokens, generated ones
        included, ``KVCacheManager.cache_blocks`` over ``Request.block_hashes``, and a block freed by a preemption
        stays cached until evicted). The engine then calls :meth:`keep_own_pages` before freeing the victim's
        slot and looks the re-admission up with ``own`` (:meth:`lookup`). vAttention's pages (``cow_partial``)
        are not kept: its re-admission hits only the prompt's hash blocks (capped at ``seq_len - 1`` tokens)."""
        return not self.cow_partial

    def keep_own_pages(self, slot: int, owner: int, computed_tokens: int) -> int:
        """Turn the slot's private full pages of computed KV (after its cache entries) into cache entries keyed
        ``(page, "own", owner)``: pages no other request can match (the trace names no content beyond the
        prompt's hash blocks) but the owner's re-admission can, as vLLM v1 hits a preempted request's own
        blocks. Call before the slot is freed; the pages then enter the eviction order as the entries they
        are (tail first, :meth:`_unmap_range`). Stops at a page whose key is cached already (kept by an
        earlier preemption and not hit again: the same KV, so the older entry serves the lookup).

        Args:
            slot: the victim's slot (active).
            owner: the request's id (unique among the requests this policy serves).
            computed_tokens: its KV tokens (tokens); only pages full of them are kept.

        Returns:
            The number of pages turned into entries.
        """
        keys = self.slot_keys[slot]
        last = min(self.mapped[slot], computed_tokens // self.config.tokens_per_page)
        page, kept = self.shared[slot], 0
        while page < last:
            key = (page, "own", owner)
            if key in self.cache:
                break
            self._new_entry(key, slot, keys[-1] if keys else None, tiered=False)
            keys.append(key)
            self.shared[slot] += 1
            page += 1
            kept += 1
        return kept

    def _index_partials(self, chain: Sequence[int], page: int, key: tuple) -> None:
        per_page, block = self.config.tokens_per_page, self.block_tokens
        for blocks in range(page * per_page // block + 1, (page + 1) * per_page // block):
            if chain[blocks - 1] not in self._partial_index:
                self._partial_index[chain[blocks - 1]] = key
                self.admission_epoch += 1
                self.lookup_version += 1
                self._partials_of.setdefault(key, []).append(chain[blocks - 1])
