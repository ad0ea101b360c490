import { referenceOutline } from '../../api/docs-outline';

describe('the API reference outline (/docs before Swagger UI has rendered)', () => {
  const doc = {
    info: { title: 'T <b>', version: '1.0', description: 'Use "X-API-Key" & more' },
    paths: {
      '/v1/agents': { get: { tags: ['agents'], summary: 'List agents' }, post: { tags: ['agents'], summary: 'Create <script>alert(1)</script>' } },
      "/v1/x/{id}'": { parameters: [], delete: { tags: ['a b'], operationId: 'del/x' } },
      '/healthz': { get: {} },
    },
  };

  it('lists every operation by tag, linked to its place in Swagger UI', () => {
    const html = referenceOutline(doc);
    expect(html.match(/<li>/g)).toHaveLength(4);
    expect(html).toContain('<a href="#/agents"><code class="sap-method sap-get">GET</code> <code>/v1/agents</code></a> List agents</li>');
    expect(html).toContain('href="#/a%20b/del%2Fx"');
    // Untagged operations are under "default"; tags are sorted.
    expect(html.indexOf('>a b</h2>')).toBeLessThan(html.indexOf('>agents</h2>'));
    expect(html).toContain('>default</h2>');
  });

  it('escapes every string of the document', () => {
    const html = referenceOutline(doc);
    expect(html).not.toContain('<script>');
    expect(html).not.toContain('<b>');
    expect(html).toContain('Create &lt;script&gt;alert(1)&lt;/script&gt;');
    expect(html).toContain('T &lt;b&gt; <small>1.0</small>');
    expect(html).toContain('Use &quot;X-API-Key&quot; &amp; more');
    expect(html).toContain('<code>/v1/x/{id}&#39;</code>');
  });
});
