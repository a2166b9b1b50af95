/**
 * Kubernetes label selectors: matching, and a canonical key so equal selectors share one evaluation. Pure.
 */
import type { LabelSelector } from './model.ts';

/** Whether `labels` satisfy every term of `selector` (matchLabels and matchExpressions are ANDed). */
export function matchesSelector(selector: LabelSelector, labels: Readonly<Record<string, string>>): boolean {
  for (const [key, value] of Object.entries(selector.matchLabels ?? {})) {
    if (labels[key] !== value) return false;
  }
  for (const req of selector.matchExpressions ?? []) {
    const has = Object.hasOwn(labels, req.key);
    switch (req.operator) {
      case 'In':
        if (!has || !req.values.includes(labels[req.key] as string)) return false;
        break;
      case 'NotIn':
        if (has && req.values.includes(labels[req.key] as string)) return false;
        break;
      case 'Exists':
        if (!has) return false;
        break;
      case 'DoesNotExist':
        if (has) return false;
        break;
    }
  }
  return true;
}

/** A string equal for selectors that select the same labels the same way (order of terms and values ignored). */
export function selectorKey(selector: LabelSelector | undefined): string {
  if (selector === undefined) return '-';
  const labels = Object.entries(selector.matchLabels ?? {}).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const exprs = (selector.matchExpressions ?? []).map((r) => [r.key, r.operator, [...r.values].sort()] as const).sort((a, b) => (JSON.stringify(a) < JSON.stringify(b) ? -1 : 1));
  return JSON.stringify([labels, exprs]);
}

/**
 * A selector as `kubectl get -l` writes one (`role=web,tier in (a,b),!legacy`); '' for the empty selector, which
 * selects everything.
 */
export function describeSelector(selector: LabelSelector): string {
  const terms = Object.entries(selector.matchLabels ?? {}).map(([k, v]) => `${k}=${v}`);
  for (const r of selector.matchExpressions ?? []) {
    if (r.operator === 'Exists') terms.push(r.key);
    else if (r.operator === 'DoesNotExist') terms.push(`!${r.key}`);
    else terms.push(`${r.key} ${r.operator === 'In' ? 'in' : 'notin'} (${r.values.join(',')})`);
  }
  return terms.join(',');
}
