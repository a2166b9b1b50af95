/** SVG primitives for the lab picture: text, boxes, numbers and escaping, all with fixed formats (same input, same bytes). */

export interface Box { x: number; y: number; w: number; h: number }
export interface Point { x: number; y: number }

/** Escapes text for XML content and attribute values. */
export function escapeXml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&apos;' })[c] ?? c);
}

/** A generous estimate of a text's width (about 0.6 em per character), so labels never overlap. */
export const textWidth = (text: string, size: number): number => Math.ceil(text.length * size * 0.6);

/** Cuts text to fit `width` pixels, with an ellipsis. */
export function fit(text: string, width: number, size: number): string {
  const max = Math.floor(width / (size * 0.6));
  return text.length <= max ? text : `${text.slice(0, Math.max(1, max - 1))}…`;
}

/** Numbers in the SVG: at most one decimal, so output is stable. */
export const n = (v: number): string => String(Math.round(v * 10) / 10);

/** A text element; `halo` outlines it in that colour so that lines crossing it do not hide it. */
export function text(x: number, y: number, s: string, attrs: { size: number; weight?: 'bold'; fill?: string; anchor?: 'middle' | 'end'; halo?: string }): string {
  const halo = attrs.halo ? ` stroke="${attrs.halo}" stroke-width="4" stroke-linejoin="round" paint-order="stroke"` : '';
  const extra = `${attrs.weight ? ` font-weight="${attrs.weight}"` : ''}${attrs.anchor ? ` text-anchor="${attrs.anchor}"` : ''}${halo}`;
  return `<text x="${n(x)}" y="${n(y)}" font-size="${attrs.size}" fill="${attrs.fill ?? '#212121'}"${extra}>${escapeXml(s)}</text>`;
}

export function rect(b: Box, attrs: { fill: string; stroke: string; width?: number; dash?: string; rx?: number; title?: string }): string {
  const dash = attrs.dash ? ` stroke-dasharray="${attrs.dash}"` : '';
  const open = `<rect x="${n(b.x)}" y="${n(b.y)}" width="${n(b.w)}" height="${n(b.h)}" rx="${attrs.rx ?? 6}" fill="${attrs.fill}" stroke="${attrs.stroke}" stroke-width="${attrs.width ?? 1}"${dash}`;
  return attrs.title ? `${open}><title>${escapeXml(attrs.title)}</title></rect>` : `${open}/>`;
}
