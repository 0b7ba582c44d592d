package dev.onceflow.accesslog;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.StreamReadConstraints;
import com.fasterxml.jackson.core.json.JsonReadFeature;
import com.fasterxml.jackson.core.util.JsonRecyclerPools;
import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The access-log rules of onceflow_apps.access_log.rules, compiled: what the streaming job, its replays, recounts and
 * backfills run in Spark (through dev.onceflow.accesslog.spark.ParseRecord) and the Flink contender of `make bench`
 * runs in Flink. The reference parser in Python (rules.parse) is the specification: the tests check this class
 * against it record for record. The regular expressions and limits are not restated here: the caller passes them
 * from rules.py (COMBINED_RE, EPOCH_MS_RE, ISO_TS_RE, IPV4, MIN/MAX_TS_MS, MAX_RECORD_BYTES), and they are applied as
 * full matches. Timestamps and the JSON reader follow Python's rules where Java's own differ (time-zone offsets up
 * to 23:59, NaN and Infinity, the 4,300-digit integer limit).
 *
 * Stateless apart from what it compiles on first use (immutable, safe to share).
 */
public final class Rules implements Serializable {
  private static final long serialVersionUID = 2L;

  public static final String EMPTY = "empty";
  public static final String TOO_LARGE = "too_large";
  public static final String NOT_UTF8 = "not_utf8";
  public static final String BAD_JSON = "bad_json";
  public static final String BAD_TS = "bad_timestamp";
  public static final String TS_RANGE = "timestamp_out_of_range";
  public static final String BAD_IP = "bad_ip";
  public static final String UNRECOGNIZED = "unrecognized_format";
  public static final String TS_AHEAD = "timestamp_ahead";

  // Python's int() refuses a decimal text of more digits than this (sys.int_info.default_max_str_digits), and so
  // does its JSON reader (a ValueError: bad_json).
  private static final int PY_MAX_INT_DIGITS = 4300;
  private static final String[] MONTHS = {
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"
  };

  private final String combinedRe;
  private final String epochRe;
  private final String isoRe;
  private final String ipv4Re;
  private final long minTsMs;
  private final long maxTsMs;
  private final int maxRecordBytes;
  private final long maxAheadMs;

  private transient Compiled compiled;

  /** What is compiled once: final fields, so another thread that sees the object sees them whole. */
  private static final class Compiled {
    final Pattern combined;
    final Pattern epoch;
    final Pattern iso;
    final Pattern ipv4;
    final JsonFactory json;

    Compiled(Rules r) {
      combined = Pattern.compile(r.combinedRe);
      epoch = Pattern.compile(r.epochRe);
      iso = Pattern.compile(r.isoRe);
      ipv4 = Pattern.compile(r.ipv4Re);
      json = JsonFactory.builder()
          // Python's JSON reads NaN, Infinity and -Infinity as numbers (the other spellings Jackson would take
          // are refused below)
          .enable(JsonReadFeature.ALLOW_NON_NUMERIC_NUMBERS)
          // Python's limits, not Jackson's: any number length (integers are checked below), any name length
          .streamReadConstraints(StreamReadConstraints.builder().maxNumberLength(Integer.MAX_VALUE)
              .maxNameLength(Integer.MAX_VALUE).build())
          // Jackson's default pool keeps its buffers in a ThreadLocal; in Spark's executor threads that lookup took
          // 7 % of a backlog's CPU (a long probe in their ThreadLocal maps). A shared pool takes no ThreadLocal.
          .recyclerPool(JsonRecyclerPools.newConcurrentDequePool())
          .build();
    }
  }

  /** maxAheadMs: the timestamp_ahead rule's limit for parse(value, recordTsMs, o); negative: no such rule. */
  public Rules(String combinedRe, String epochRe, String isoRe, String ipv4Re, long minTsMs, long maxTsMs,
      int maxRecordBytes, long maxAheadMs) {
    this.combinedRe = combinedRe;
    this.epochRe = epochRe;
    this.isoRe = isoRe;
    this.ipv4Re = ipv4Re;
    this.minTsMs = minTsMs;
    this.maxTsMs = maxTsMs;
    this.maxRecordBytes = maxRecordBytes;
    this.maxAheadMs = maxAheadMs;
    c(); // a pattern that does not compile fails here, where the rules are made, not in a task
  }

  private Compiled c() {
    Compiled got = compiled;
    if (got == null) {
      got = new Compiled(this);
      compiled = got; // a race compiles twice, harmlessly
    }
    return got;
  }

  /** A record's outcome: tsUs and ip when valid, else reason. */
  public static final class Outcome {
    public long tsUs;
    public String ip;
    public String reason;
  }

  private static Outcome bad(Outcome o, String reason) {
    o.reason = reason;
    o.ip = null;
    return o;
  }

  /** rules.parse(value, recordTsMs, maxAheadMs): the value's rules, then the timestamp_ahead rule. */
  public Outcome parse(byte[] value, long recordTsMs, Outcome o) {
    parse(value, o);
    if (o.reason == null && maxAheadMs >= 0 && Math.floorDiv(o.tsUs, 1000L) > recordTsMs + maxAheadMs) {
      return bad(o, TS_AHEAD);
    }
    return o;
  }

  /** rules._parse_value: what a record's bytes alone say. */
  public Outcome parse(byte[] value, Outcome o) {
    o.reason = null;
    o.ip = null;
    o.tsUs = 0L;
    if (value == null || value.length == 0) {
      return bad(o, EMPTY);
    }
    if (value.length > maxRecordBytes) {
      return bad(o, TOO_LARGE);
    }
    if (!Utf8.valid(value)) {
      return bad(o, NOT_UTF8);
    }
    // text.strip(" "): a space is one byte in UTF-8, so the bytes are trimmed as the text would be
    int a = 0;
    int b = value.length;
    while (a < b && value[a] == ' ') {
      a++;
    }
    while (b > a && value[b - 1] == ' ') {
      b--;
    }
    String text = new String(value, a, b - a, StandardCharsets.UTF_8);
    if (a < b && value[a] == '{') {
      return json(text, o);
    }
    return line(text, o);
  }

  // ------------------------------------------------------------------------------------------------ JSON records
  private static final int NONE = 0;
  private static final int INT = 1;
  private static final int STRING = 2;

  private Outcome json(String text, Outcome o) {
    // Like Python's JSONDecoder().raw_decode: one object, trailing characters after it ignored, but the record must
    // end with the closing brace. The last of duplicate keys wins.
    int tsKind = NONE;
    String ts = null;
    String ip = null;
    try (JsonParser p = c().json.createParser(text)) {
      if (p.nextToken() != JsonToken.START_OBJECT) {
        return bad(o, BAD_JSON);
      }
      for (JsonToken t = p.nextToken(); t != JsonToken.END_OBJECT; t = p.nextToken()) {
        if (t != JsonToken.FIELD_NAME) {
          return bad(o, BAD_JSON);
        }
        String name = p.currentName();
        JsonToken v = p.nextToken();
        if (!valueOk(p, v)) {
          return bad(o, BAD_JSON);
        }
        if ("ts".equals(name)) {
          tsKind = v == JsonToken.VALUE_NUMBER_INT ? INT : v == JsonToken.VALUE_STRING ? STRING : NONE;
          ts = tsKind == NONE ? null : p.getText();
        } else if ("ip".equals(name)) {
          ip = v == JsonToken.VALUE_STRING ? p.getText() : null;
        }
      }
    } catch (Exception e) { // Jackson's parse errors; anything else it throws on a record is a bad record too
      return bad(o, BAD_JSON);
    }
    if (!text.endsWith("}")) {
      return bad(o, BAD_JSON);
    }
    Long tsUs = null;
    if (tsKind == INT) {
      // str() of a JSON integer: its digits; -0 is 0
      tsUs = epochOrIso("-0".equals(ts) ? "0" : ts);
    } else if (tsKind == STRING) {
      tsUs = epochOrIso(ts);
    }
    if (!timestampOk(tsUs, o)) {
      return o;
    }
    String canonical = ip == null ? null : canonicalIp(ip);
    if (canonical == null) {
      return bad(o, BAD_IP);
    }
    o.tsUs = tsUs;
    o.ip = canonical;
    return o;
  }

  /** A value Python's JSON reader takes too (`v`, the token just read; nested values are read through here). */
  private static boolean valueOk(JsonParser p, JsonToken v) throws java.io.IOException {
    if (v == null) {
      return false;
    }
    switch (v) {
      case START_OBJECT:
      case START_ARRAY:
        for (JsonToken t = p.nextToken(); t != JsonToken.END_OBJECT && t != JsonToken.END_ARRAY; t = p.nextToken()) {
          if (t == JsonToken.FIELD_NAME) {
            t = p.nextToken();
          }
          if (!valueOk(p, t)) {
            return false;
          }
        }
        return true;
      case VALUE_NUMBER_INT:
        String digits = p.getText();
        return digits.length() - (digits.charAt(0) == '-' ? 1 : 0) <= PY_MAX_INT_DIGITS;
      case VALUE_NUMBER_FLOAT:
        if (!p.isNaN()) {
          return true;
        }
        String literal = p.getText(); // Jackson also takes +Infinity, +INF and -INF; Python does not
        return "NaN".equals(literal) || "Infinity".equals(literal) || "-Infinity".equals(literal);
      default:
        return true;
    }
  }

  private Long epochOrIso(String raw) {
    if (c().epoch.matcher(raw).matches()) {
      return Long.parseLong(raw) * 1000L;
    }
    if (!c().iso.matcher(raw).matches()) {
      return null;
    }
    return isoToUs(raw);
  }

  /**
   * datetime.fromisoformat of a text ISO_TS_RE matched: `YYYY-MM-DDTHH:MM:SS[.f{1,6}](Z|+HH:MM|-HH:MM)`, its
   * fields at fixed places. Python's checks: year from 1, a real date, hour < 24, minute and second < 60, an offset
   * strictly within a day (its minutes may exceed 59: +01:75 is 2:15).
   */
  private static Long isoToUs(String s) {
    long micros = 0;
    int i = 19;
    if (s.charAt(i) == '.') {
      int scale = 100_000;
      for (i = 20; i < s.length() && Character.isDigit(s.charAt(i)); i++) {
        micros += (s.charAt(i) - '0') * scale;
        scale /= 10;
      }
    }
    int offsetMin = 0;
    if (s.charAt(i) != 'Z') {
      offsetMin = num(s, i + 1, 2) * 60 + num(s, i + 4, 2);
      if (s.charAt(i) == '-') {
        offsetMin = -offsetMin;
      }
    }
    return civilToUs(num(s, 0, 4), num(s, 5, 2), num(s, 8, 2), num(s, 11, 2), num(s, 14, 2), num(s, 17, 2), micros,
        offsetMin);
  }

  private static int num(String s, int at, int len) {
    int n = 0;
    for (int k = at; k < at + len; k++) {
      n = n * 10 + (s.charAt(k) - '0');
    }
    return n;
  }

  /** Microseconds since the epoch of a local time at an offset, or null where Python's datetime refuses it. */
  private static Long civilToUs(int year, int month, int day, int hour, int minute, int second, long micros,
      int offsetMin) {
    if (year < 1 || month < 1 || month > 12 || day < 1 || day > daysIn(year, month) || hour > 23 || minute > 59
        || second > 59 || Math.abs(offsetMin) >= 24 * 60) {
      return null;
    }
    long days = java.time.LocalDate.of(year, month, day).toEpochDay();
    long seconds = days * 86_400L + hour * 3600L + minute * 60L + second - offsetMin * 60L;
    return seconds * 1_000_000L + micros;
  }

  private static int daysIn(int year, int month) {
    if (month == 2) {
      boolean leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
      return leap ? 29 : 28;
    }
    return month == 4 || month == 6 || month == 9 || month == 11 ? 30 : 31;
  }

  private boolean timestampOk(Long tsUs, Outcome o) {
    if (tsUs == null) {
      bad(o, BAD_TS);
      return false;
    }
    if (!(minTsMs * 1000L <= tsUs && tsUs < maxTsMs * 1000L)) {
      bad(o, TS_RANGE);
      return false;
    }
    return true;
  }

  // ------------------------------------------------------------------------------------------------ log lines
  private Outcome line(String text, Outcome o) {
    Matcher m = c().combined.matcher(text);
    if (!m.matches()) {
      return bad(o, UNRECOGNIZED);
    }
    Long tsUs = combinedTsToUs(text, m.start(2));
    if (!timestampOk(tsUs, o)) {
      return o;
    }
    String ip = canonicalIp(m.group(1));
    if (ip == null) {
      return bad(o, BAD_IP);
    }
    o.tsUs = tsUs;
    o.ip = ip;
    return o;
  }

  /**
   * rules._combined_ts_to_us of `dd/Mon/yyyy:HH:mm:ss +zzzz` at `at` (COMBINED_RE matched its shape): an English
   * month name in any case, Python's datetime checks, an offset of up to 99 minutes past its hours, within a day.
   */
  private static Long combinedTsToUs(String s, int at) {
    String mon = s.substring(at + 3, at + 6);
    int month = 0;
    for (int k = 0; k < 12; k++) {
      if (MONTHS[k].equalsIgnoreCase(mon)) {
        month = k + 1;
        break;
      }
    }
    if (month == 0) {
      return null;
    }
    int offsetMin = num(s, at + 22, 2) * 60 + num(s, at + 24, 2);
    if (s.charAt(at + 21) == '-') {
      offsetMin = -offsetMin;
    }
    return civilToUs(num(s, at + 7, 4), month, num(s, at, 2), num(s, at + 12, 2), num(s, at + 15, 2),
        num(s, at + 18, 2), 0L, offsetMin);
  }

  // ------------------------------------------------------------------------------------------------ addresses
  /** rules.canonical_ip: the RFC 5952 text of a valid IPv4 or IPv6 address, else null. */
  public String canonicalIp(String candidate) {
    if (candidate == null) {
      return null;
    }
    // Every valid spelling is ASCII; lower-casing a text with any other character never makes it valid (Python's
    // lower() maps no other character to a digit, a to f, ':' or '.'), so such a text is refused at once.
    char[] s = new char[candidate.length()];
    for (int k = 0; k < s.length; k++) {
      char ch = candidate.charAt(k);
      if (ch > 127) {
        return null;
      }
      s[k] = ch >= 'A' && ch <= 'Z' ? (char) (ch + 32) : ch;
    }
    String low = new String(s);
    if (c().ipv4.matcher(low).matches()) {
      return low;
    }
    if (low.indexOf(':') < 0) {
      return null;
    }
    int[] v = ipv6Groups(low);
    return v == null ? null : renderIpv6(v);
  }

  /** The eight groups of an IPv6 text (lower case), a dotted IPv4 at its end as its last two; null if it is not one. */
  private int[] ipv6Groups(String s) {
    int[] tail = null;
    String head = s;
    if (s.indexOf('.') >= 0) {
      int i = s.lastIndexOf(':');
      String v4 = s.substring(i + 1);
      if (!c().ipv4.matcher(v4).matches()) {
        return null;
      }
      int[] o = new int[4];
      int at = 0;
      for (int k = 0; k < 4; k++) {
        int dot = k < 3 ? v4.indexOf('.', at) : v4.length();
        o[k] = Integer.parseInt(v4, at, dot, 10);
        at = dot + 1;
      }
      tail = new int[] {(o[0] << 8) | o[1], (o[2] << 8) | o[3]};
      head = s.substring(0, i + 1) + "0:0"; // two placeholder groups, replaced by tail below
    }
    int gap = head.indexOf("::");
    if (gap >= 0 && head.indexOf("::", gap + 1) >= 0) {
      return null; // two `::` (a `:::` included: Python's split finds a second)
    }
    int[] v = new int[8];
    if (gap < 0) {
      if (!groups(head, 0, head.length(), v, 0, 8)) {
        return null;
      }
    } else {
      int left = count(head, 0, gap);
      int right = count(head, gap + 2, head.length());
      if (left + right > 7) {
        return null;
      }
      if (!groups(head, 0, gap, v, 0, left) || !groups(head, gap + 2, head.length(), v, 8 - right, right)) {
        return null;
      }
    }
    if (tail != null) {
      v[6] = tail[0];
      v[7] = tail[1];
    }
    return v;
  }

  /** How many groups `s[from, to)` holds (split on ':'; an empty text: none). */
  private static int count(String s, int from, int to) {
    if (from == to) {
      return 0;
    }
    int n = 1;
    for (int k = from; k < to; k++) {
      if (s.charAt(k) == ':') {
        n++;
      }
    }
    return n;
  }

  /** `s[from, to)` split on ':' into exactly `n` groups of 1 to 4 hex digits, into v[at..]. */
  private static boolean groups(String s, int from, int to, int[] v, int at, int n) {
    if (n == 0) {
      return from == to;
    }
    int k = from;
    for (int g = 0; g < n; g++) {
      int end = g < n - 1 ? s.indexOf(':', k) : to;
      if (end < 0 || end > to || end - k < 1 || end - k > 4) {
        return false;
      }
      int x = 0;
      for (int q = k; q < end; q++) {
        int d = Character.digit(s.charAt(q), 16);
        if (d < 0 || s.charAt(q) > 'f') { // lower case only (the text is lower-cased)
          return false;
        }
        x = x * 16 + d;
      }
      v[at + g] = x;
      k = end + 1;
    }
    return true;
  }

  private static String renderIpv6(int[] v) {
    if (v[0] == 0 && v[1] == 0 && v[2] == 0 && v[3] == 0 && v[4] == 0 && v[5] == 0xFFFF) {
      return "::ffff:" + (v[6] >> 8) + "." + (v[6] & 255) + "." + (v[7] >> 8) + "." + (v[7] & 255);
    }
    int best = 0;
    int bestLen = 0;
    int run = 0;
    for (int i = 0; i < 8; i++) {
      run = v[i] == 0 ? run + 1 : 0;
      if (run > bestLen) {
        best = i - run + 1;
        bestLen = run;
      }
    }
    StringBuilder sb = new StringBuilder(40);
    if (bestLen < 2) {
      for (int i = 0; i < 8; i++) {
        if (i > 0) {
          sb.append(':');
        }
        sb.append(Integer.toHexString(v[i]));
      }
      return sb.toString();
    }
    for (int i = 0; i < best; i++) {
      if (i > 0) {
        sb.append(':');
      }
      sb.append(Integer.toHexString(v[i]));
    }
    sb.append("::");
    for (int i = best + bestLen; i < 8; i++) {
      if (i > best + bestLen) {
        sb.append(':');
      }
      sb.append(Integer.toHexString(v[i]));
    }
    return sb.toString();
  }
}
