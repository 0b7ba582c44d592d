"""Record corpora the parsing tests share: corner cases and mutated generator output (the Spark parse and the
Flink contender are checked against the reference parser on it), and IPv6 addresses in every spelling."""

import random

from onceflow_dev import generator

CORNER = [
    b'203.0.113.9 - - [21/Nov/2026:22:00:01 +0000] "GET / HTTP/1.1" 200 512 "-" "curl/8.5"',
    b'2001:db8::7 - - [21/nov/2026:22:00:01 -0530] "GET /a\\"b HTTP/1.1" 200 - "-" "x"',
    b'fe80::1%eth0 - - [21/Nov/2026:22:00:01 +0000] "GET / HTTP/1.1" 200 1 "-" "x"',
    b'1.2.3.4 - - [31/Feb/2026:22:00:01 +0000] "GET / HTTP/1.1" 200 1 "-" "x"',
    b'{"ts": 1795303741123, "ip": "10.0.0.1"}',
    b'{"ts": "2026-11-21T22:00:01.5Z", "ip": "2001:DB8::1"}',
    b'{"ts": "2026-11-21T22:00:01+01:00", "ip": "::ffff:1.2.3.4"}',
    b'{"ts": 1.5, "ip": "10.0.0.1"}',
    b'{"ts": 1, "ip": "1.2.3.4"} junk',
    b'{"ts": 1, "ip": "1.2.3.4"}\n',
    b'{"ts":1,"ip":"1.2.3.4"}}',
    b"{'ts': 1, 'ip': '1.2.3.4'}",
    b'{"ts": 1, "ip": "1.2.3.4", "ts": 2}',
    b'{"ts": -5, "ip": "1.2.3.4"}',
    b'{"ts": "2026-11-21T22:00:01.1234567Z", "ip": "1.2.3.4"}',
    b'{"ts": 1e3, "ip": "1.2.3.4"}',
    b'{"ts": {"a": 1}, "ip": "1.2.3.4"}',
    b'{"ts": 1, "ip": 5}',
    b"{}",
    b"[1, 2]",
    b"",
    b"\xff\xfe",
    b'  {"ts":"0005", "ip":"1.2.3.4"}  ',
    b'{"ts": 99999999999999, "ip": "::1"}',
    b"x" * 70000,
    b'{"ts": 4102444799999, "ip": "::1"}',
    b'{"ts": 4102444800000, "ip": "::1"}',
    b'{"ts": 1795298400000, "ip": "1.1.1.1"}',
    b'{"ts": 1795298404999, "ip": "1.1.1.1"}',
]


def _line(ts: str, ip: str = "203.0.113.9") -> bytes:
    return f'{ip} - - [{ts}] "GET / HTTP/1.1" 200 1 "-" "x"'.encode()


def _js(ts: str, ip: str = '"1.2.3.4"', extra: str = "") -> bytes:
    return ('{"ts": ' + ts + ', "ip": ' + ip + extra + "}").encode()


# Where Java's own parsers and Python's differ, the compiled rules (access_log/java) follow Python's: time-zone offsets
# up to 23:59 (and minutes past 59), years from 1, NaN and Infinity as JSON numbers but not Jackson's other spellings,
# Python's 4,300-digit limit on integers, strict UTF-8.
EDGES = [
    _line("21/Nov/2026:22:00:01 +0175"),
    _line("21/Nov/2026:22:00:01 +2359"),
    _line("21/Nov/2026:22:00:01 -2359"),
    _line("21/Nov/2026:22:00:01 +2400"),
    _line("21/NOV/2026:22:00:01 +1900"),
    _line("29/Feb/2024:00:00:00 +0000"),
    _line("29/Feb/2026:00:00:00 +0000"),
    _line("01/Jan/0000:00:00:00 +0000"),
    _line("01/Jan/0001:00:30:00 +0100"),
    _line("31/Dec/2099:23:59:59 +0000"),
    _line("01/Jan/2100:00:00:00 +0000"),
    _line("01/Jan/2100:00:59:59 +0100"),
    _line("21/Nov/2026:24:00:00 +0000"),
    _line("21/Nov/2026:23:60:00 +0000"),
    _line("21/Nov/2026:23:59:60 +0000"),
    _line("21/Foo/2026:23:59:59 +0000"),
    _line("21/Nov/2026:22:00:01 +0000", "::FFFF:1.2.3.4"),
    _line("21/Nov/2026:22:00:01 +0000", "2001:0db8:0000:0000:0000:0000:0000:0001"),
    _js('"2026-11-21T22:00:01+01:75"'),
    _js('"2026-11-21T22:00:01+23:59"'),
    _js('"2026-11-21T22:00:01+24:00"'),
    _js('"2026-11-21T22:00:01-00:00"'),
    _js('"2026-11-21T22:00:01.000001Z"'),
    _js('"2026-11-21T22:00:01.9Z"'),
    _js('"0000-01-01T00:00:00Z"'),
    _js('"0001-01-01T00:00:00Z"'),
    _js('"2024-02-29T12:00:00Z"'),
    _js('"2026-02-29T12:00:00Z"'),
    _js('"2026-11-21T22:00:60Z"'),
    _js('"2026-11-21T22:00:01z"'),
    _js('"1795298400000"'),
    _js('"0"'),
    _js("-0"),
    _js("0"),
    _js("-1795298400000"),
    _js("1795298400000", extra=', "x": NaN'),
    _js("1795298400000", extra=', "x": [Infinity, -Infinity]'),
    _js("1795298400000", extra=', "x": +Infinity'),
    _js("1795298400000", extra=', "x": -INF'),
    _js("1795298400000", extra=', "x": {"y": [+INF]}'),
    _js("NaN"),
    _js("1795298400000", extra=', "x": 1' + "0" * 4299),
    _js("1795298400000", extra=', "x": -1' + "0" * 4299),
    _js("1795298400000", extra=', "x": 1' + "0" * 4300),
    _js("1795298400000", extra=', "x": 1.' + "0" * 5000),
    _js("1795298400000", extra=', "' + "k" * 60000 + '": 1'),
    _js("1795298400000", extra=', "x": ' + "[" * 200 + "]" * 200),
    _js("1795298400000", extra=r', "x": "\u00e9\ud800"'),  # JSON escapes: a lone surrogate
    _js("1795298400000", extra=r', "x": "a\tb"'),  # an escaped tab
    _js("1795298400000", extra=', "x": "a\tb"'),  # a raw tab, a control character
    _js("1795298400000", extra=r', "x": "\x41"'),  # not a JSON escape
    _js("1795298400000", extra=r', "\u0074s": 5'),  # an escaped name, "ts"
    _js("1795298400000", extra=', "ip": 5'),
    _js("1795298400000", extra=', "ip": "2001:db8::1"'),
    _js("1795298400000", extra=', "ts": {"a": 1}'),
    _js("1795298400000", extra=", // c"),
    _js("1795298400000", extra=","),
    _js("true"),
    _js("null"),
    _js("1795298400000", ip="'1.2.3.4'"),
    b'{"ts": 1795298400000, "ip": "1.2.3.4"} trailing }',
    b'{"ts": 1795298400000, "ip": "1.2.3.4"}\x00}',
    b'{"ts": 1795298400000, "ip": "1.2.3.4"}\t',
    b'{"ts"\t:\r1795298400000,\n"ip":"1.2.3.4"}',
    b'{"ts": 1795298400000, "ip": "1.2.3.4"\x0b}',
    b"\xc0\xaf" + _js("1795298400000"),
    b"\xed\xa0\x80" + _js("1795298400000"),
    b"\xf4\x90\x80\x80" + _js("1795298400000"),
    b"\xe2\x82" + _js("1795298400000"),
    _js("1795298400000", extra=', "x": "\u20ac \U0001f600"'),  # multi-byte UTF-8
    b"   ",
    b" \t" + _js("1795298400000"),
]


def _mutate(rng: random.Random, b: bytes) -> bytes:
    b = bytearray(b)
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(3)
        i = rng.randrange(len(b) + 1)
        if op == 0 and b:
            del b[min(i, len(b) - 1)]
        elif op == 1:
            b[i:i] = bytes([rng.choice(b'{}[]":, .-+Z:T0123456789abcdef\\\n/')])
        elif b:
            b[min(i, len(b) - 1)] = rng.randrange(32, 127)
    return bytes(b)


def corpus(n=1500, seed=11):
    rng = random.Random(seed)
    base = []
    for _ in range(200):
        ip = rng.choice(
            ["10.0.%d.%d" % (rng.randrange(256), rng.randrange(256)), "2001:db8::%x" % rng.randrange(1 << 16)]
        )
        ts = 1795298400000 + rng.randrange(10**7)
        base.append(generator._json_record(ip, ts, rng)[0])
        base.append(generator._combined_line(ip, ts, rng)[0])
        base.append(generator._malformed(ip, ts, rng))
    return CORNER + EDGES + base + [_mutate(rng, rng.choice(base)) for _ in range(n)]


def spellings(rng, v: int) -> list[str]:
    """Several texts of the 128-bit address v: full, zero-padded, upper-case, compressed at another run, with an
    embedded dotted IPv4."""
    g = [(v >> (112 - 16 * i)) & 0xFFFF for i in range(8)]
    out = [":".join(f"{x:x}" for x in g), ":".join(f"{x:04X}" for x in g)]
    zeros = [i for i, x in enumerate(g) if x == 0]
    if zeros:
        i = rng.choice(zeros)
        j = i
        while j + 1 < 8 and g[j + 1] == 0 and rng.random() < 0.7:
            j += 1
        out.append(":".join(f"{x:x}" for x in g[:i]) + "::" + ":".join(f"{x:x}" for x in g[j + 1 :]))
    out.append(":".join(f"{x:x}" for x in g[:6]) + f":{g[6] >> 8}.{g[6] & 255}.{g[7] >> 8}.{g[7] & 255}")
    return out


def random_addresses(n=3000, seed=7):
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        g = [rng.choice([0, 0, 0, 1, 0xFFFF, rng.randrange(1 << 16)]) for _ in range(8)]
        if rng.random() < 0.1:
            g[:6] = [0, 0, 0, 0, 0, 0xFFFF]
        out.append(sum(x << (112 - 16 * i) for i, x in enumerate(g)))
    return rng, out
