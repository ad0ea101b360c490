/**
 * The API reference's outline, written into /docs as plain HTML: the title, the description and every
 * operation (method, path, summary) grouped by tag. The page shows it at once, while Swagger UI's
 * bundle (1.7 MB of script) loads and compiles behind it; Swagger UI replaces it once it has rendered,
 * and each entry links to the operation's place in Swagger UI (its deep links, `#/<tag>/<operationId>`).
 */

/** The parts of an OpenAPI document the outline reads. */
export interface OutlineDoc {
  info: { title: string; version: string; description?: string };
  paths?: Record<string, object | undefined>;
}

const METHODS = ['get', 'put', 'post', 'delete', 'options', 'head', 'patch', 'trace'] as const;

const escapeHtml = (s: string): string => s.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!);

/** Swagger UI's deep link of an operation's tag and the operation. */
const deepLink = (tag: string, operationId: string | undefined): string =>
  `#/${encodeURIComponent(tag)}${operationId ? `/${encodeURIComponent(operationId)}` : ''}`;

/** The outline's HTML (a <section>), every string of the document escaped. */
export function referenceOutline(doc: OutlineDoc): string {
  const byTag = new Map<string, string[]>();
  for (const [path, item] of Object.entries(doc.paths ?? {})) {
    for (const method of METHODS) {
      const op = (item as Record<string, unknown> | undefined)?.[method] as { tags?: string[]; summary?: string; operationId?: string } | undefined;
      if (!op) continue;
      const tag = op.tags?.[0] ?? 'default';
      const line =
        `<li><a href="${escapeHtml(deepLink(tag, op.operationId))}"><code class="sap-method sap-${method}">${method.toUpperCase()}</code> ` +
        `<code>${escapeHtml(path)}</code></a>${op.summary ? ` ${escapeHtml(op.summary)}` : ''}</li>`;
      const lines = byTag.get(tag) ?? [];
      lines.push(line);
      byTag.set(tag, lines);
    }
  }
  const tags = [...byTag.entries()]
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([tag, lines]) => `<h2 id="sap-tag-${escapeHtml(tag)}">${escapeHtml(tag)}</h2><ul>${lines.join('')}</ul>`);
  return (
    `<section id="sap-docs-outline" class="sap-docs-outline">` +
    `<h1>${escapeHtml(doc.info.title)} <small>${escapeHtml(doc.info.version)}</small></h1>` +
    (doc.info.description ? `<p>${escapeHtml(doc.info.description)}</p>` : '') +
    `<p class="sap-docs-loading">The interactive reference is loading; every operation is listed below.</p>` +
    tags.join('') +
    `</section>`
  );
}
