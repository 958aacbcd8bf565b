"""Python's cycle collector tuned for `outboxq worker`'s processes (the command's own, or each child's); an
application that embeds a Worker keeps its own settings unless it calls tune_collector itself. (`outboxq serve`
only freezes what it built at start-up: a larger young generation made its 1,000-job batch requests slower.)

A drain allocates and frees a few objects per job, most of them freed by reference counting, but a claimed
batch's jobs live until they are completed: at the default threshold (700 net allocations) the collector ran
about 360 young collections, 33 middle and 3 full ones in a one-process drain of 50,000 jobs, 110-130 ms in
all, every one of them with the GIL held, so every thread stood still meanwhile; a full collection walked
everything the process had imported (50,000 objects, 20-25 ms each). Frozen, what the start-up built is no
longer walked; with a young generation of YOUNG_THRESHOLD, a drain of 50,000 jobs ran none at all
(bench/README.md, 2026-12-06).
"""

from __future__ import annotations

import gc

# Net allocations of container objects between two young collections (Python's default: 700). Cyclic garbage
# waits at most this many allocations longer to be freed: a few megabytes at worst.
YOUNG_THRESHOLD = 10_000


def tune_collector() -> None:
    """Freeze what the process has built so far (after collecting its garbage) and run young collections
    every YOUNG_THRESHOLD net allocations; call it once the process has started up."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
