package dev.onceflow.flink;

import dev.onceflow.accesslog.Rules;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.Map;

/**
 * The job's parse rules on a corpus, for comparing them with onceflow's reference parser: stdin one record a line
 * (`<kafka timestamp ms> <base64 value>`), stdout one verdict a line (`reason|-` TAB `ts_us` TAB `ip`). Takes the
 * rule arguments of IpCount (--combined-re ... --max-ahead-ms).
 */
public final class RulesCheck {
  private RulesCheck() {}

  public static void main(String[] argv) throws Exception {
    Map<String, String> a = IpCount.args(argv);
    Rules rules = new Rules(a.get("combined-re"), a.get("epoch-re"), a.get("iso-re"), a.get("ipv4-re"),
        Long.parseLong(a.get("min-ts-ms")), Long.parseLong(a.get("max-ts-ms")),
        Integer.parseInt(a.get("max-record-bytes")), Long.parseLong(a.get("max-ahead-ms")));
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    PrintStream out = new PrintStream(System.out, false, StandardCharsets.UTF_8);
    Rules.Outcome o = new Rules.Outcome();
    for (String line = in.readLine(); line != null; line = in.readLine()) {
      String[] parts = line.split(" ", -1);
      byte[] value = Base64.getDecoder().decode(parts[1]);
      rules.parse(value, Long.parseLong(parts[0]), o);
      out.println(o.reason == null ? "-\t" + o.tsUs + "\t" + o.ip : o.reason + "\t\t");
    }
    out.flush();
  }
}
