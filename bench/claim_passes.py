"""A prepared claim's cost to the server, in one pass over its rows against two (pick, then claim),
without Spark: the claim alone, the part of the drain the two ways differ in.

`claimMode` prepared claims plain messages in one pass (`Claimer._take`: DELETE ... RETURNING
seq, headers, judged as they come back, then PREPARE TRANSACTION); a claim with a poison, odd,
forwarded or retry-acknowledging row is made in two (`claimer.pick` locks and reads the rows,
then the numbered claim deletes them). This script times both on the same server, interleaved
(one, two, one, two, ...), each run on a fresh queue of --messages NServiceBus-shaped messages
with --size random bytes (NServiceBus's DDL; VACUUM ANALYZE and CHECKPOINT before it): a
`Receiver` claims the whole queue, --per-trigger a claim, each claim ended by PREPARE
TRANSACTION; metered are the claims only (PostgreSQL CPU of every server process, WAL bytes).
The claims are then acknowledged (COMMIT PREPARED), unmetered. Beside them, the floor: the same
rows deleted by `DELETE ... RETURNING id, expires, headers, body, seq`, one transaction per
--per-trigger, fetched into Python (`_common.floor`), which also reads the bodies the claim
leaves to the executors. The server: embedded PostgreSQL with fsync on and PostgreSQL's default
settings (shared_buffers 128MB, max_wal_size 1GB, ...) with max_prepared_transactions 20.

    python bench/claim_passes.py [--messages 200000] [--per-trigger 50000] [--size 1024] [--repeat 5]

Prints each way's median and spread over --repeat runs of µs of server CPU and WAL bytes per
message, and the one-pass claim's ratio to the two-pass one.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Cost, Meter, arguments, floor  # noqa: E402
from claim_modes import SERVERS, fresh  # noqa: E402

QUEUE = "BenchClaimPasses"
#: claim_modes.py's `default` server: PostgreSQL's defaults for what the embedded server sets, and 20
#: prepared transactions
SERVER = SERVERS["default"]
WAYS = ("one pass", "pick, then claim", "floor")


def claims(url: str, meter: Meter, n: int, per_trigger: int, *, one_pass: bool) -> Cost:
    """Claim the whole queue, `per_trigger` a claim, each prepared; the claims metered; then
    acknowledged."""
    from spark_qtransport.transport.receiving import claimer
    from spark_qtransport.transport.receiving.receiver import Receiver
    from spark_qtransport.transport.settings import ReceiveSettings

    made = claimer.Claimer._transaction

    def transaction(self: Any, conn: Any, request: Any, *, one_pass: bool = one_pass) -> Any:
        return made(self, conn, request, one_pass=one_pass)

    claimer.Claimer._transaction = transaction  # type: ignore[method-assign]
    cost = Cost()
    r = Receiver(ReceiveSettings.create(url, QUEUE, error_queue="error", claim_ahead=False, claim_mode="prepared"))
    try:
        start = end = r.initial_offset()
        with meter.measure(cost):
            while r.claimed < n:
                end = r.latest(end, per_trigger)
        assert r.holds_prepared, "the claims are held by prepared transactions"
        r.ack(end)
    finally:
        r.close()
        claimer.Claimer._transaction = made  # type: ignore[method-assign]
    assert start != end
    cost.rows = n
    return cost


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument("--repeat", type=int, default=5, help="runs of each way, interleaved (default 5)")
    args = ap.parse_args()
    from spark_qtransport.cli.embedded import EmbeddedPostgres

    n, k = args.messages, args.per_trigger
    pg = EmbeddedPostgres(fsync=True, settings=SERVER).start()
    runs: dict[str, list[Cost]] = {w: [] for w in WAYS}
    try:
        meter = Meter(pg.url)
        print(f"embedded PostgreSQL, fsync on, {', '.join(f'{k_} {v}' for k_, v in SERVER.items())}; {n:,} x"
              f" {args.size} B random bodies, NServiceBus's DDL and headers, {k:,} a claim; {args.repeat} runs a way\n")
        for i in range(args.repeat):
            for way in WAYS:
                fresh(pg.url, QUEUE, n, args.size, "error")
                if way == "floor":
                    cost = Cost()
                    with meter.measure(cost):
                        floor(pg.url, QUEUE, n, k)
                    cost.rows = n
                else:
                    cost = claims(pg.url, meter, n, k, one_pass=way == "one pass")
                runs[way].append(cost)
                print(f"  run {i + 1}, {way}: {cost.pg / n * 1e6:.2f} µs CPU, {cost.wal / n:,.0f} B WAL a message",
                      flush=True)
        meter.close()
    finally:
        pg.stop()
    print("\n| way | server CPU µs/msg, median (min-max) | WAL B/msg, median (min-max) |")
    print("|---|---:|---:|")
    medians = {}
    for way, costs in runs.items():
        cpu = [c.pg / n * 1e6 for c in costs]
        wal = [c.wal / n for c in costs]
        medians[way] = statistics.median(cpu)
        print(f"| {way} | {medians[way]:.2f} ({min(cpu):.2f}-{max(cpu):.2f}) |"
              f" {statistics.median(wal):,.0f} ({min(wal):,.0f}-{max(wal):,.0f}) |")
    print(f"\none pass / pick, then claim: {medians['one pass'] / medians['pick, then claim']:.2f}x the server's CPU;"
          f" the floor (the whole drain at least once) {medians['floor']:.2f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
