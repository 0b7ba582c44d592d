package dev.onceflow.accesslog.spark;

import dev.onceflow.accesslog.Rules;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF1;

/**
 * The access-log rules as a Spark function: a record's value (binary) to struct<ts_us bigint, ip string, reason
 * string>, `ts_us` and `ip` set for a good record, `reason` for a malformed one (onceflow_apps.access_log.parsing
 * registers it in a session and applies the rules that need more than the value: quarantine, timestamp_ahead).
 */
public final class ParseRecord implements UDF1<byte[], Row> {
  private static final long serialVersionUID = 1L;

  private final Rules rules;

  public ParseRecord(Rules rules) {
    this.rules = rules;
  }

  @Override
  public Row call(byte[] value) {
    Rules.Outcome o = rules.parse(value, new Rules.Outcome());
    return o.reason == null ? RowFactory.create(o.tsUs, o.ip, null) : RowFactory.create(null, null, o.reason);
  }
}
