package dev.onceflow.flink;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.Serializable;
import java.nio.ByteBuffer;
import java.nio.CharBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CharsetDecoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.time.OffsetDateTime;
import java.time.format.DateTimeFormatter;
import java.time.format.DateTimeFormatterBuilder;
import java.time.format.ResolverStyle;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * onceflow's parse rules (onceflow_apps.access_log.rules) in Java. The regular expressions and limits are not restated
 * here: the bench passes them from rules.py (COMBINED_RE, EPOCH_MS_RE, ISO_TS_RE, IPV4, MIN/MAX_TS_MS,
 * MAX_RECORD_BYTES), the same text the Spark job compiles as Java regexes. Full matches (Matcher.matches), like
 * the Spark job's `\z` anchoring. The steps and their order follow rules._parse_value.
 */
public final class Rules implements Serializable {
  private static final long serialVersionUID = 1L;

  public static final String EMPTY = "empty";
  public static final String TOO_LARGE = "too_large";
  public static final String NOT_UTF8 = "not_utf8";
  public static final String BAD_JSON = "bad_json";
  public static final String BAD_TS = "bad_timestamp";
  public static final String TS_RANGE = "timestamp_out_of_range";
  public static final String BAD_IP = "bad_ip";
  public static final String UNRECOGNIZED = "unrecognized_format";
  public static final String TS_AHEAD = "timestamp_ahead";

  private final String combinedRe;
  private final String epochRe;
  private final String isoRe;
  private final String ipv4Re;
  private final long minTsMs;
  private final long maxTsMs;
  private final int maxRecordBytes;
  private final long maxAheadMs;

  private transient Pattern combined;
  private transient Pattern epoch;
  private transient Pattern iso;
  private transient Pattern ipv4;
  private transient Pattern hextet;
  private transient ObjectMapper mapper;
  private transient JsonFactory jsonFactory;
  private transient DateTimeFormatter lineTs;

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
  }

  private void init() {
    if (combined != null) {
      return;
    }
    combined = Pattern.compile(combinedRe);
    epoch = Pattern.compile(epochRe);
    iso = Pattern.compile(isoRe);
    ipv4 = Pattern.compile(ipv4Re);
    hextet = Pattern.compile("[0-9a-f]{1,4}");
    mapper = new ObjectMapper();
    jsonFactory = mapper.getFactory();
    // records.COMBINED_TS_FORMAT, "dd/MMM/yyyy:HH:mm:ss Z", English month names in any case
    lineTs = new DateTimeFormatterBuilder().parseCaseInsensitive().appendPattern("dd/MMM/uuuu:HH:mm:ss Z")
        .toFormatter(Locale.ENGLISH).withResolverStyle(ResolverStyle.STRICT);
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

  /** Classify one source record (its value and its Kafka timestamp) into `o`. */
  public Outcome parse(byte[] value, long recordTsMs, Outcome o) {
    init();
    o.reason = null;
    o.ip = null;
    if (value == null || value.length == 0) {
      return bad(o, EMPTY);
    }
    if (value.length > maxRecordBytes) {
      return bad(o, TOO_LARGE);
    }
    String text;
    try {
      CharsetDecoder dec = StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
          .onUnmappableCharacter(CodingErrorAction.REPORT);
      CharBuffer cb = dec.decode(ByteBuffer.wrap(value));
      text = cb.toString();
    } catch (CharacterCodingException e) {
      return bad(o, NOT_UTF8);
    }
    text = stripSpaces(text);
    if (text.startsWith("{")) {
      parseJson(text, o);
    } else {
      parseLine(text, o);
    }
    if (o.reason == null && maxAheadMs >= 0 && o.tsUs / 1000 > recordTsMs + maxAheadMs) {
      return bad(o, TS_AHEAD);
    }
    return o;
  }

  private static String stripSpaces(String s) {
    int a = 0;
    int b = s.length();
    while (a < b && s.charAt(a) == ' ') {
      a++;
    }
    while (b > a && s.charAt(b - 1) == ' ') {
      b--;
    }
    return s.substring(a, b);
  }

  private void parseJson(String text, Outcome o) {
    JsonNode obj;
    // One object; trailing characters after it are ignored, but the record must end with the closing brace.
    try (JsonParser p = jsonFactory.createParser(text)) {
      obj = mapper.readTree(p);
    } catch (Exception e) {
      bad(o, BAD_JSON);
      return;
    }
    if (obj == null || !obj.isObject() || !text.endsWith("}")) {
      bad(o, BAD_JSON);
      return;
    }
    JsonNode ts = obj.get("ts");
    String raw = null;
    if (ts != null && ts.isIntegralNumber()) {
      raw = ts.asText();
    } else if (ts != null && ts.isTextual()) {
      raw = ts.textValue();
    }
    Long tsUs = null;
    if (raw != null) {
      if (epoch.matcher(raw).matches()) {
        tsUs = Long.parseLong(raw) * 1000L;
      } else {
        tsUs = isoToUs(raw);
      }
    }
    if (!timestampOk(tsUs, o)) {
      return;
    }
    JsonNode ipNode = obj.get("ip");
    String ip = ipNode != null && ipNode.isTextual() ? canonicalIp(ipNode.textValue()) : null;
    if (ip == null) {
      bad(o, BAD_IP);
      return;
    }
    o.tsUs = tsUs;
    o.ip = ip;
  }

  /** A parsed event time, or the reason it is not one (bad_timestamp, timestamp_out_of_range). */
  private boolean timestampOk(Long tsUs, Outcome o) {
    if (tsUs == null) {
      bad(o, BAD_TS);
      return false;
    }
    if (!inRange(tsUs)) {
      bad(o, TS_RANGE);
      return false;
    }
    return true;
  }

  private void parseLine(String text, Outcome o) {
    Matcher m = combined.matcher(text);
    if (!m.matches()) {
      bad(o, UNRECOGNIZED);
      return;
    }
    Long tsUs;
    try {
      OffsetDateTime dt = OffsetDateTime.parse(m.group(2), lineTs);
      tsUs = toUs(dt.toInstant());
    } catch (RuntimeException e) {
      tsUs = null;
    }
    if (!timestampOk(tsUs, o)) {
      return;
    }
    String ip = canonicalIp(m.group(1));
    if (ip == null) {
      bad(o, BAD_IP);
      return;
    }
    o.tsUs = tsUs;
    o.ip = ip;
  }

  private Long isoToUs(String s) {
    if (!iso.matcher(s).matches()) {
      return null;
    }
    try {
      return toUs(OffsetDateTime.parse(s, DateTimeFormatter.ISO_OFFSET_DATE_TIME).toInstant());
    } catch (RuntimeException e) {
      return null;
    }
  }

  private static Long toUs(Instant i) {
    return Math.addExact(Math.multiplyExact(i.getEpochSecond(), 1_000_000L), i.getNano() / 1000L);
  }

  private boolean inRange(long tsUs) {
    return minTsMs * 1000L <= tsUs && tsUs < maxTsMs * 1000L;
  }

  /** records.canonical_ip: RFC 5952 text of a valid IPv4 or IPv6 address, else null. */
  public String canonicalIp(String candidate) {
    init();
    if (candidate == null) {
      return null;
    }
    String s = candidate.toLowerCase(Locale.ROOT);
    if (ipv4.matcher(s).matches()) {
      return s;
    }
    if (s.indexOf(':') < 0) {
      return null;
    }
    if (s.indexOf('.') >= 0) {
      int i = s.lastIndexOf(':');
      String v4 = s.substring(i + 1);
      if (!ipv4.matcher(v4).matches()) {
        return null;
      }
      String[] o = v4.split("\\.");
      int a = Integer.parseInt(o[0]);
      int b = Integer.parseInt(o[1]);
      int c = Integer.parseInt(o[2]);
      int d = Integer.parseInt(o[3]);
      s = s.substring(0, i) + ":" + Integer.toHexString((a << 8) | b) + ":" + Integer.toHexString((c << 8) | d);
    }
    String[] halves = s.split("::", -1);
    if (halves.length > 2) {
      return null;
    }
    List<String> groups = new ArrayList<>(8);
    if (halves.length == 2) {
      List<String> left = halves[0].isEmpty() ? List.of() : Arrays.asList(halves[0].split(":", -1));
      List<String> right = halves[1].isEmpty() ? List.of() : Arrays.asList(halves[1].split(":", -1));
      if (left.size() + right.size() > 7) {
        return null;
      }
      groups.addAll(left);
      for (int k = 0; k < 8 - left.size() - right.size(); k++) {
        groups.add("0");
      }
      groups.addAll(right);
    } else {
      groups.addAll(Arrays.asList(s.split(":", -1)));
    }
    if (groups.size() != 8) {
      return null;
    }
    int[] v = new int[8];
    for (int k = 0; k < 8; k++) {
      if (!hextet.matcher(groups.get(k)).matches()) {
        return null;
      }
      v[k] = Integer.parseInt(groups.get(k), 16);
    }
    return renderIpv6(v);
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
