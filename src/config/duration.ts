const UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/** Parses `250ms`, `90s`, `30m`, `24h`, `7d` into milliseconds; undefined when it is none of those. */
export function parseDuration(text: string): number | undefined {
  const m = /^(\d+)(ms|s|m|h|d)$/.exec(text.trim());
  if (!m) return undefined;
  return Number(m[1]) * (UNITS[m[2] as string] as number);
}
