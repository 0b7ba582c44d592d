package dev.onceflow.flink;

import dev.onceflow.accesslog.Rules;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.time.Duration;
import java.time.Instant;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.AggregateFunction;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.configuration.CheckpointingOptions;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.RestOptions;
import org.apache.flink.configuration.RestartStrategyOptions;
import org.apache.flink.configuration.StateBackendOptions;
import org.apache.flink.connector.base.DeliveryGuarantee;
import org.apache.flink.connector.kafka.sink.KafkaRecordSerializationSchema;
import org.apache.flink.connector.kafka.sink.KafkaSink;
import org.apache.flink.connector.kafka.source.KafkaSource;
import org.apache.flink.connector.kafka.source.enumerator.initializer.OffsetsInitializer;
import org.apache.flink.connector.kafka.source.reader.deserializer.KafkaRecordDeserializationSchema;
import org.apache.flink.core.execution.CheckpointingMode;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.datastream.SingleOutputStreamOperator;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.ProcessFunction;
import org.apache.flink.streaming.api.functions.windowing.ProcessWindowFunction;
import org.apache.flink.streaming.api.windowing.assigners.TumblingEventTimeWindows;
import org.apache.flink.streaming.api.windowing.windows.TimeWindow;
import org.apache.flink.util.Collector;
import org.apache.flink.util.OutputTag;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.ProducerRecord;

/**
 * onceflow's query on Flink, the contender of `make bench` (onceflow_dev.bench_flink): Kafka source (earliest,
 * every partition, read_committed) -> onceflow's parse rules -> per-partition bounded-out-of-orderness
 * watermarks -> tumbling event-time windows per IP -> count -> KafkaSink (EXACTLY_ONCE, one transaction per
 * subtask per checkpoint). Malformed records go to a DLQ topic (key topic|partition|offset, the value as it was,
 * capped), also exactly once. Output records carry the Spark job's key and JSON value, byte for byte.
 *
 * <p>Arguments: --name value pairs (see main). Runs as a local mini-cluster in this JVM.
 */
public final class IpCount {
  private IpCount() {}

  /** A source record after parsing: ip and tsMs when good; otherwise the DLQ key and value. */
  public static final class Parsed {
    public String ip;
    public long tsMs;
    public String dlqKey;
    public byte[] dlqValue;

    public Parsed() {}
  }

  static final OutputTag<Tuple2<String, byte[]>> DLQ =
      new OutputTag<>("dlq", Types.TUPLE(Types.STRING, Types.PRIMITIVE_ARRAY(Types.BYTE)));

  /** Parses in the source (one pass over the bytes, no copy of the raw record between operators). */
  static final class Deser implements KafkaRecordDeserializationSchema<Parsed> {
    private static final long serialVersionUID = 1L;
    private final Rules rules;
    private final int dlqMaxBytes;
    private transient Rules.Outcome scratch;

    Deser(Rules rules, int dlqMaxBytes) {
      this.rules = rules;
      this.dlqMaxBytes = dlqMaxBytes;
    }

    @Override
    public void deserialize(ConsumerRecord<byte[], byte[]> r, Collector<Parsed> out) {
      if (scratch == null) {
        scratch = new Rules.Outcome();
      }
      Rules.Outcome o = rules.parse(r.value(), r.timestamp(), scratch);
      Parsed p = new Parsed();
      if (o.reason == null) {
        p.ip = o.ip;
        p.tsMs = Math.floorDiv(o.tsUs, 1000L);
      } else {
        p.dlqKey = r.topic() + "|" + r.partition() + "|" + r.offset();
        byte[] v = r.value() == null ? new byte[0] : r.value();
        p.dlqValue = v.length > dlqMaxBytes ? Arrays.copyOf(v, dlqMaxBytes) : v;
      }
      out.collect(p);
    }

    @Override
    public TypeInformation<Parsed> getProducedType() {
      return TypeInformation.of(Parsed.class);
    }
  }

  /** Good records to the main output, malformed ones to the DLQ; notes the first record's wall-clock time. */
  static final class Split extends ProcessFunction<Parsed, Tuple2<String, Long>> {
    private static final long serialVersionUID = 1L;
    private final String statusDir;
    private transient boolean seen;

    Split(String statusDir) {
      this.statusDir = statusDir;
    }

    @Override
    public void processElement(Parsed p, Context ctx, Collector<Tuple2<String, Long>> out) throws IOException {
      if (!seen) {
        seen = true;
        int idx = getRuntimeContext().getTaskInfo().getIndexOfThisSubtask();
        writeAtomically(Paths.get(statusDir, "first_record_ms." + idx), Long.toString(System.currentTimeMillis()));
      }
      if (p.ip != null) {
        out.collect(Tuple2.of(p.ip, p.tsMs));
      } else {
        ctx.output(DLQ, Tuple2.of(p.dlqKey, p.dlqValue));
      }
    }
  }

  static final class CountAgg implements AggregateFunction<Tuple2<String, Long>, Long, Long> {
    private static final long serialVersionUID = 1L;

    @Override
    public Long createAccumulator() {
      return 0L;
    }

    @Override
    public Long add(Tuple2<String, Long> value, Long acc) {
      return acc + 1;
    }

    @Override
    public Long getResult(Long acc) {
      return acc;
    }

    @Override
    public Long merge(Long a, Long b) {
      return a + b;
    }
  }

  /** The Spark job's sink record: key `window_start|ip`, value to_json(window_start, window_end, ip, count). */
  static final class ToRecord extends ProcessWindowFunction<Long, Tuple2<String, String>, String, TimeWindow> {
    private static final long serialVersionUID = 1L;
    private static final DateTimeFormatter ISO_MS =
        DateTimeFormatter.ofPattern("yyyy-MM-dd'T'HH:mm:ss.SSS'Z'").withZone(ZoneOffset.UTC);

    @Override
    public void process(String ip, Context ctx, Iterable<Long> counts, Collector<Tuple2<String, String>> out) {
      long n = counts.iterator().next();
      String ws = ISO_MS.format(Instant.ofEpochMilli(ctx.window().getStart()));
      String we = ISO_MS.format(Instant.ofEpochMilli(ctx.window().getEnd()));
      String value = "{\"window_start\":\"" + ws + "\",\"window_end\":\"" + we + "\",\"ip\":\"" + ip
          + "\",\"count\":" + n + "}";
      out.collect(Tuple2.of(ws + "|" + ip, value));
    }
  }

  static void writeAtomically(Path path, String text) throws IOException {
    Path tmp = path.resolveSibling(path.getFileName() + ".tmp");
    Files.writeString(tmp, text);
    Files.move(tmp, path, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
  }

  static <T> KafkaSink<T> sink(Map<String, String> a, String topic, String prefix,
      KafkaRecordSerializationSchema<T> ser) {
    Properties p = new Properties();
    p.setProperty("transaction.timeout.ms", a.get("txn-timeout-ms"));
    p.setProperty("linger.ms", a.get("linger-ms"));
    return KafkaSink.<T>builder()
        .setBootstrapServers(a.get("bootstrap"))
        .setKafkaProducerConfig(p)
        .setRecordSerializer(ser)
        .setDeliveryGuarantee(DeliveryGuarantee.EXACTLY_ONCE)
        .setTransactionalIdPrefix(prefix)
        .build();
  }

  static Map<String, String> args(String[] argv) {
    Map<String, String> a = new HashMap<>();
    for (int i = 0; i + 1 < argv.length; i += 2) {
      if (!argv[i].startsWith("--")) {
        throw new IllegalArgumentException("expected --name value pairs, got " + argv[i]);
      }
      a.put(argv[i].substring(2), argv[i + 1]);
    }
    return a;
  }

  static String need(Map<String, String> a, String k) {
    String v = a.get(k);
    if (v == null) {
      throw new IllegalArgumentException("missing --" + k);
    }
    return v;
  }

  public static void main(String[] argv) throws Exception {
    Map<String, String> a = args(argv);
    for (String k : new String[] {"bootstrap", "source", "sink", "dlq", "group", "txn-prefix", "parallelism",
        "checkpoint-ms", "checkpoint-dir", "window-s", "watermark-s", "status-dir", "txn-timeout-ms", "linger-ms",
        "combined-re", "epoch-re", "iso-re", "ipv4-re", "min-ts-ms", "max-ts-ms", "max-record-bytes",
        "max-ahead-ms", "dlq-max-bytes"}) {
      need(a, k);
    }
    int parallelism = Integer.parseInt(a.get("parallelism"));
    Files.createDirectories(Paths.get(a.get("status-dir")));

    Configuration conf = new Configuration();
    conf.set(StateBackendOptions.STATE_BACKEND, "hashmap");
    conf.set(CheckpointingOptions.CHECKPOINT_STORAGE, "filesystem");
    conf.set(CheckpointingOptions.CHECKPOINTS_DIRECTORY, a.get("checkpoint-dir"));
    // A failure ends the process (the bench reports it) instead of restarting out of sight.
    conf.set(RestartStrategyOptions.RESTART_STRATEGY, "none");
    conf.set(RestOptions.BIND_PORT, "0"); // any free port: nothing else on the machine may hold 8081
    StreamExecutionEnvironment env = StreamExecutionEnvironment.createLocalEnvironment(parallelism, conf);
    env.enableCheckpointing(Long.parseLong(a.get("checkpoint-ms")), CheckpointingMode.EXACTLY_ONCE);

    Rules rules = new Rules(a.get("combined-re"), a.get("epoch-re"), a.get("iso-re"), a.get("ipv4-re"),
        Long.parseLong(a.get("min-ts-ms")), Long.parseLong(a.get("max-ts-ms")),
        Integer.parseInt(a.get("max-record-bytes")), Long.parseLong(a.get("max-ahead-ms")));
    KafkaSource<Parsed> source = KafkaSource.<Parsed>builder()
        .setBootstrapServers(a.get("bootstrap"))
        .setTopics(a.get("source"))
        .setGroupId(a.get("group"))
        .setStartingOffsets(OffsetsInitializer.earliest())
        .setDeserializer(new Deser(rules, Integer.parseInt(a.get("dlq-max-bytes"))))
        .setProperty("isolation.level", "read_committed")
        .setProperty("partition.discovery.interval.ms", "-1")
        .setProperty("commit.offsets.on.checkpoint", "true")
        .build();
    // Watermarks per Kafka partition (the source's split-local generators), min across partitions and inputs;
    // a malformed record carries no event time and never moves them.
    WatermarkStrategy<Parsed> wm = WatermarkStrategy
        .<Parsed>forBoundedOutOfOrderness(Duration.ofSeconds(Long.parseLong(a.get("watermark-s"))))
        .withTimestampAssigner((p, kafkaTs) -> p.ip != null ? p.tsMs : Long.MIN_VALUE);

    SingleOutputStreamOperator<Tuple2<String, Long>> good = env.fromSource(source, wm, "kafka-source")
        .process(new Split(a.get("status-dir")))
        .returns(Types.TUPLE(Types.STRING, Types.LONG))
        .name("parse");
    DataStream<Tuple2<String, String>> results = good
        .keyBy(t -> t.f0, Types.STRING)
        .window(TumblingEventTimeWindows.of(Duration.ofSeconds(Long.parseLong(a.get("window-s")))))
        .aggregate(new CountAgg(), new ToRecord(), Types.LONG, Types.LONG,
            Types.TUPLE(Types.STRING, Types.STRING))
        .name("count-per-ip");

    final String sinkTopic = a.get("sink");
    final String dlqTopic = a.get("dlq");
    KafkaRecordSerializationSchema<Tuple2<String, String>> resultSer = (el, ctx, ts) ->
        new ProducerRecord<>(sinkTopic, el.f0.getBytes(StandardCharsets.UTF_8),
            el.f1.getBytes(StandardCharsets.UTF_8));
    KafkaRecordSerializationSchema<Tuple2<String, byte[]>> dlqSer = (el, ctx, ts) ->
        new ProducerRecord<>(dlqTopic, el.f0.getBytes(StandardCharsets.UTF_8), el.f1);
    results.sinkTo(sink(a, sinkTopic, a.get("txn-prefix"), resultSer)).name("sink");
    good.getSideOutput(DLQ).sinkTo(sink(a, dlqTopic, a.get("txn-prefix") + "-dlq", dlqSer)).name("dlq");
    env.execute("onceflow-ip-count-flink");
  }
}
