/**
 * Structured logs: one JSON object per line on stderr (never stdout, which the CLI may use for answers).
 */
import type { Logger } from '../../core/ports.ts';

export type Level = 'debug' | 'info' | 'warn' | 'error';
const ORDER: Record<Level, number> = { debug: 10, info: 20, warn: 30, error: 40 };

export interface JsonLoggerInit {
  readonly level?: Level;
  readonly base?: Record<string, unknown>;
  readonly write?: (line: string) => void;
}

export function jsonLogger(init: JsonLoggerInit = {}): Logger {
  const min = ORDER[init.level ?? 'info'];
  const write = init.write ?? ((line: string) => process.stderr.write(line));
  const base = init.base ?? {};
  const emit = (level: Level, msg: string, fields?: Record<string, unknown>) => {
    if (ORDER[level] < min) return;
    write(JSON.stringify({ time: new Date().toISOString(), level, ...base, msg, ...fields }, errorReplacer) + '\n');
  };
  return {
    debug: (m, f) => emit('debug', m, f),
    info: (m, f) => emit('info', m, f),
    warn: (m, f) => emit('warn', m, f),
    error: (m, f) => emit('error', m, f),
    child: (component) => jsonLogger({ ...init, base: { ...base, component } }),
  };
}

function errorReplacer(_key: string, value: unknown): unknown {
  if (value instanceof Error) {
    const code = (value as { code?: unknown }).code;
    return { message: value.message, code, cause: value.cause instanceof Error ? value.cause.message : value.cause };
  }
  return value;
}
