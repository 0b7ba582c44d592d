"""ip_networks: every request tagged with the network its IP belongs to, exactly once (the second shipped app).

Different in kind from ip_count, on the same access-log records:
- no window and no state: a stateless enrichment, one result per good source record, whenever it arrives (nothing
  is ever late, nothing waits for a watermark);
- keyed by IP, not by (window, IP): a consumer finds each IP's requests in one sink partition, in order;
- joined with a small reference table, networks.csv in this package (CIDR blocks and their names, no overlaps);
- two outputs: the requests of listed networks on its sink topic, the others (`unlisted` and `ipv6`) on its named
  output `unlisted` (topic `<sink topic>-unlisted`), both in each batch's one transaction;
- two sources: the access logs of its source topic and those of a second site on its named source `mirror` (topic
  `<source topic>-mirror`), read by one Kafka source, each batch's range and proof covering both.

The table is part of the app's code: its results are deterministic as long as the table is the same, and a changed
table is a changed app (the replay proof names the batches computed with the old one). An IP in no listed block is
`unlisted`; an IPv6 address is `ipv6`.

Result: key `<ip>`, value `{"ts", "ip", "network", "source"}` with `source` the record's `topic|partition|offset`.
"""

from __future__ import annotations

import csv
import functools
import ipaddress
from pathlib import Path
from typing import TYPE_CHECKING

from onceflow.app import App, AppError, Context, Results
from onceflow_apps import access_log

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

TABLE = Path(__file__).with_name("networks.csv")
UNLISTED = "unlisted"
IPV6 = "ipv6"
OUTPUT_UNLISTED = "unlisted"  # the named output of the requests of no listed network (App.outputs)
SOURCE_MIRROR = "mirror"  # the named source of a second site's access logs (App.sources)


@functools.cache
def networks(path: Path = TABLE) -> tuple[tuple[int, int, str], ...]:
    """The reference table as (first, last, name) IPv4 numbers, in order; refused when two blocks overlap (a
    record would then be tagged twice)."""
    rows = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            net = ipaddress.IPv4Network(row["cidr"].strip())
            rows.append((int(net.network_address), int(net.broadcast_address), row["network"].strip()))
    rows.sort()
    for (_, hi, a), (lo, _, b) in zip(rows, rows[1:], strict=False):
        if lo <= hi:
            raise AppError(f"ip_networks: blocks of {a} and {b} overlap in {path}")
    return tuple(rows)


def output_of(network: str) -> str | None:
    """The named output a request of that network goes to (None: the sink topic), in plain Python: the tests' truth."""
    return OUTPUT_UNLISTED if network in (UNLISTED, IPV6) else None


def network_of(ip: str) -> str:
    """The network of a canonical IP, by the table (what the plan computes, in plain Python: the tests' truth)."""
    if ":" in ip:
        return IPV6
    n = int(ipaddress.IPv4Address(ip))
    return next((name for lo, hi, name in networks() if lo <= n <= hi), UNLISTED)


def _ipv4_number(ip: Column) -> Column:
    from pyspark.sql import functions as F

    o = F.split(ip, r"\.")
    return F.when(
        ~ip.contains(":"),
        o[0].cast("long") * 16777216 + o[1].cast("long") * 65536 + o[2].cast("long") * 256 + o[3].cast("long"),
    )


def transform(raw: DataFrame, ctx: Context) -> Results:
    from pyspark.sql import functions as F

    from onceflow_apps.access_log import parsing  # the access-log parser, shared with ip_count

    parsed = parsing.classify(
        raw.select("value", "topic", "partition", "offset", "timestamp"),
        ctx.settings.max_event_ahead_ms,
        ctx.quarantine,
    )
    table = raw.sparkSession.createDataFrame(list(networks()), "lo long, hi long, network string")
    good = parsed.where(F.col("reason").isNull()).withColumn("ip_num", _ipv4_number(F.col("ip")))
    tagged = good.join(F.broadcast(table), (F.col("ip_num") >= F.col("lo")) & (F.col("ip_num") <= F.col("hi")), "left")
    network = F.when(F.col("ip").contains(":"), F.lit(IPV6)).otherwise(F.coalesce(F.col("network"), F.lit(UNLISTED)))
    rows = tagged.select(
        F.col("ip").alias("key"),
        F.to_json(
            F.struct(
                F.date_format(F.col("ts"), "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'").alias("ts"),
                F.col("ip"),
                network.alias("network"),
                F.concat_ws("|", "topic", F.col("partition").cast("string"), F.col("offset").cast("string")).alias(
                    "source"
                ),
            )
        ).alias("value"),
        F.when(network.isin(UNLISTED, IPV6), F.lit(OUTPUT_UNLISTED)).alias("output"),
    )
    rejects = parsed.where(F.col("reason").isNotNull()).select(
        "value", "topic", "partition", "offset", "timestamp", "reason"
    )
    return Results(rows=rows, rejects=rejects)


app = App(
    name="ip_networks",
    transform=transform,
    description="every request tagged with its IP's network (a reference table), one result per record",
    # no windows: a batch that only closes windows has nothing to close
    settings={"source_partitions": 4, "sink_partitions": 4, "close_out_batches": False},
    reasons=access_log.REASONS,
    sources={SOURCE_MIRROR: "the same service's access logs from a second site"},
    outputs={OUTPUT_UNLISTED: "the requests whose IP is in no listed network, IPv6 ones included"},
    rules_version=access_log.rules.RULES_VERSION,
    java=access_log.JAVA,  # the compiled parse (onceflow_apps.access_log.parsing)
    event_time=False,
)
