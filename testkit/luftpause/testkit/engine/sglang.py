"""SGLang's admission arithmetic, for the engine core's `sglang` admission mode.

Pure module: numbers in, numbers out; no state (the core keeps the ratio and passes it in).
Theory of operation, from SGLang 0.5.23 (python/sglang/srt/managers/schedule_policy.py
`PrefillAdder`, mem_cache/prefill_budget.py, managers/scheduler.py,
managers/scheduler_components/new_token_ratio_tracker.py); all amounts in tokens:
- the head of the queue is admitted when its cost
      uncached prompt + min(max_new - generated, CLIP) + page_size
  is below  free + evictable - offset,  where offset sums, over the running batch,
      min(max_new - generated, CLIP) * new_token_ratio
  and, over the requests admitted earlier in the same iteration, their uncached prompt (in whole
  pages) plus min(max_new - generated, CLIP). A new request reserves its whole (clipped) reply;
  a running one only `new_token_ratio` of what it has left;
- only the prompt's KV is allocated at admission; the reply's grows a page at a time;
- `new_token_ratio` starts at 0.7 and falls by (0.7 - 0.098) / 600 after every decode step that
  did not retract, down to 0.098 (0.7 * 0.14);
- when a decode step's pages do not fit in free + evictable, running requests are retracted,
  the fewest output tokens first (of equals, the longest prompt first), until they fit or one is
  left; the ratio becomes min(1, (sum of generated + 20 * n) / (sum of max_new + 1)) over the
  n requests kept.
`generated` counts the tokens a request emitted so far; it is 0 unless the request was
retracted or preempted and is now resuming.
"""

from __future__ import annotations

from collections.abc import Sequence

# SGLang's defaults: --new-token-ratio init, base_min_new_token_ratio_factor,
# new_token_ratio_decay_steps, SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION, SGLANG_RETRACT_DECODE_STEPS.
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14
DECAY_STEPS = 600
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / DECAY_STEPS
CLIP_MAX_NEW_TOKENS = 4096
RETRACT_DECODE_STEPS = 20


def reply_estimate(max_new: int, generated: int) -> int:
    """Reply tokens still to come, clipped as SGLang clips its estimate."""
    return min(max(max_new - generated, 0), CLIP_MAX_NEW_TOKENS)


def admission_cost(*, uncached: int, max_new: int, generated: int, page_size: int) -> int:
    """Tokens a waiting request must find room for to be admitted."""
    return uncached + reply_estimate(max_new, generated) + page_size


def fresh_share(*, uncached: int, max_new: int, generated: int, page_size: int) -> int:
    """What a request admitted in this iteration takes from the room of the next ones."""
    paged = -(-uncached // page_size) * page_size
    return paged + reply_estimate(max_new, generated)


def running_share(*, max_new: int, generated: int, ratio: float) -> float:
    """What a running request is expected to still need."""
    return reply_estimate(max_new, generated) * ratio


def decayed(ratio: float) -> float:
    """The ratio after a decode step that did not retract."""
    return max(ratio - NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO)


def ratio_after_retraction(generated: Sequence[int], max_new: Sequence[int]) -> float:
    """The ratio after a retraction, from the requests kept running."""
    estimate = (sum(generated) + RETRACT_DECODE_STEPS * len(generated)) / (sum(max_new) + 1)
    return min(1.0, estimate)


def retraction_key(*, generated: int, prompt_tokens: int) -> tuple[int, int]:
    """Sort key of the running requests: the smallest is retracted first."""
    return generated, -prompt_tokens
