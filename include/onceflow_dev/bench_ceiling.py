"""The benchmark's ceiling: a plain confluent-kafka transactional consume-transform-produce loop, no Spark.

Same workload and same semantics as the Spark job (parse with the reference rules, 5 s windows per IP, 5 s
watermark with Spark's late rule, each window emitted once when final, malformed records to the DLQ), one
transaction per batch of records with `send_offsets_to_transaction`, as in confluent-kafka-python's
examples/eos_transactions.py. Run as `python -m onceflow.bench_ceiling '<end offsets JSON>'` with ONCEFLOW_*
settings; prints a JSON line with its timings.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict, deque
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from onceflow import config
from onceflow.kafka import clients as kafka_clients
from onceflow.rules import clock
from onceflow_apps.access_log import rules as records


def _emit_closed(producer: Any, settings: config.Settings, state: dict[tuple[int, str], int], watermark_us: int) -> int:
    """Write every window the watermark closed (Spark's append mode: final counts, once) and forget it."""
    w_us = settings.window_s * 1_000_000
    out = 0
    for key in [k for k in state if k[0] + w_us <= watermark_us]:
        start, ip = key
        n = state.pop(key)
        value = json.dumps(
            {"window_start": records.iso_ms(start), "window_end": records.iso_ms(start + w_us), "ip": ip, "count": n},
            separators=(",", ":"),
        )
        while True:
            try:
                producer.produce(settings.sink_topic, key=records.sink_key(start, ip).encode(), value=value.encode())
                break
            except BufferError:
                producer.poll(0.05)
        out += 1
    return out


def run(settings: config.Settings, end: dict[int, int], batch_records: int = 50_000) -> dict:
    # end of partition events: a partition is read to its end when one comes (its last offsets may be a
    # transaction's marker, which no record shows)
    consumer = kafka_clients.read_committed_consumer(
        settings, group_id=settings.group_id, **{"enable.partition.eof": True}
    )
    producer = kafka_clients.transactional_producer(
        settings, settings.transactional_id, **{"linger.ms": 20, "batch.num.messages": 10000}
    )
    producer.init_transactions(60)
    w_us, wm_delay_us = settings.window_s * 1_000_000, settings.watermark_s * 1_000_000
    state: dict[tuple[int, str], int] = defaultdict(int)
    watermark_us = prev_wm_us = 0
    max_event_us = 0
    pos = {p: 0 for p in end}
    first_ms = last_ms = None
    out = dlq = consumed = batches = 0

    topic = settings.source_topic
    consumer.assign([TopicPartition(topic, p, 0) for p in sorted(end)])
    quota = max(1, batch_records // len(end))
    buf: dict[int, deque] = {p: deque() for p in end}  # read ahead, not yet in a batch
    read = {p: 0 for p in end}  # the next offset to read of each partition
    paused: set[int] = set()

    def fill() -> None:
        """Read until every partition has a batch's share buffered (or is at its end). A batch takes the same share
        of every partition, as a Spark batch reads its offset ranges: a consumer left to itself fetches partition
        by partition, and one partition's newest records would move the global watermark past records another has
        not delivered yet (on-time records dropped as late). A partition with its share is paused meanwhile."""
        while any(len(buf[p]) < quota and read[p] < end[p] for p in end):
            full = {p for p in end if len(buf[p]) >= quota or read[p] >= end[p]}
            if full - paused:
                consumer.pause([TopicPartition(topic, p) for p in full - paused])
            if paused - full:
                consumer.resume([TopicPartition(topic, p) for p in paused - full])
            paused.clear()
            paused.update(full)
            eof = []
            for m in consumer.consume(num_messages=10_000, timeout=0.2):
                e = m.error()
                p = m.partition()
                if e is not None and e.code() == KafkaError._PARTITION_EOF:
                    eof.append(p)
                    continue
                off = m.offset() or 0
                if p is not None and off >= read[p]:  # a paused partition is fetched again from its position
                    buf[p].append(m)
                    read[p] = off + 1
            # At its end, the consumer's position steps over the transaction markers no record shows. Only there:
            # read ahead of what was delivered (the position taken while records were still in flight, under
            # load), a partition counted as read to its end drops records from the batches (found by the bench's
            # check in `make test`: 200 windows missing).
            for tp in consumer.position([TopicPartition(topic, p) for p in eof if p is not None]):
                if tp.offset is not None and tp.offset > read[tp.partition]:
                    read[tp.partition] = tp.offset

    while any(read[p] < end[p] for p in end) or any(buf.values()):
        fill()
        msgs: list[Any] = []  # consumed Messages: partition() and offset() are set
        for p in sorted(end):
            for _ in range(min(quota, len(buf[p]))):
                msgs.append(buf[p].popleft())
        if not msgs:
            continue
        if first_ms is None:
            first_ms = clock.now_ms()
        producer.begin_transaction()
        for m in msgs:
            if m.error():
                raise RuntimeError(m.error())
            pos[m.partition()] = m.offset() + 1
            r = records.parse(m.value(), m.timestamp()[1], settings.max_event_ahead_ms)
            if r.reason is not None:
                producer.produce(
                    settings.dlq_topic, key=f"{m.topic()}|{m.partition()}|{m.offset()}".encode(), value=m.value()
                )
                dlq += 1
                continue
            assert r.ts_us is not None and r.ip is not None  # a record without a reason is valid: both are set
            start = records.window_start_us(r.ts_us, settings.window_s)
            if start + w_us <= prev_wm_us:
                continue  # late: Spark's rule, the previous batch's watermark
            state[(start, r.ip)] += 1
            max_event_us = max(max_event_us, r.ts_us)
        watermark_us = max(watermark_us, max_event_us - wm_delay_us)
        out += _emit_closed(producer, settings, state, watermark_us)
        prev_wm_us = watermark_us
        producer.send_offsets_to_transaction(
            [TopicPartition(settings.source_topic, p, o) for p, o in pos.items()],
            consumer.consumer_group_metadata(),
            60,
        )
        producer.commit_transaction(120)
        consumed += len(msgs)
        batches += 1
        last_ms = clock.now_ms()
    consumer.close()
    producer.flush(10)
    return {
        "first_ms": first_ms,
        "last_ms": last_ms,
        "records": consumed,
        "outputs": out,
        "dlq": dlq,
        "batches": batches,
    }


if __name__ == "__main__":
    res = run(config.load(), {int(p): int(o) for p, o in json.loads(sys.argv[1]).items()})
    print(json.dumps(res))
