package dev.onceflow.accesslog;

/**
 * Well-formed UTF-8 as Python's decoder takes it (The Unicode Standard, table 3-7): no overlong forms, no encoded
 * surrogates, nothing above U+10FFFF. Java's own decoder agrees, but costs a decoder object per call; this is one
 * pass over the bytes, allocating nothing.
 */
final class Utf8 {
  private Utf8() {}

  static boolean valid(byte[] b) {
    int i = 0;
    int n = b.length;
    while (i < n) {
      int c = b[i] & 0xFF;
      if (c < 0x80) {
        i++;
        continue;
      }
      // a lead byte: the sequence's length, and the range its second byte must be in
      int len;
      int lo = 0x80;
      int hi = 0xBF;
      if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
      } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        lo = c == 0xE0 ? 0xA0 : lo; // no overlong form
        hi = c == 0xED ? 0x9F : hi; // no surrogate
      } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        lo = c == 0xF0 ? 0x90 : lo; // no overlong form
        hi = c == 0xF4 ? 0x8F : hi; // nothing above U+10FFFF
      } else {
        return false; // 0x80-0xC1 (a continuation byte or an overlong lead) or 0xF5-0xFF
      }
      if (i + len > n) {
        return false;
      }
      int second = b[i + 1] & 0xFF;
      if (second < lo || second > hi) {
        return false;
      }
      for (int k = 2; k < len; k++) {
        if (!cont(b[i + k])) {
          return false;
        }
      }
      i += len;
    }
    return true;
  }

  private static boolean cont(byte x) {
    return (x & 0xC0) == 0x80;
  }
}
