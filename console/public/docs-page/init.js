// Renders /openapi.json with Swagger UI (its files served by the API from node_modules/swagger-ui-dist).
// "Try it out" sends the key given in Authorize as X-API-Key; Swagger UI keeps it in this page only.
//
// Swagger UI 5 resolves an OpenAPI 3.1 document through ApiDOM, which costs 1.5–2 s of CPU for our
// spec before anything shows (its 3.0 path: ~0.3 s). /openapi.json stays 3.1; this page shows a 3.0
// view of it, which says the same for the few 3.1 forms the spec uses: `type: [T, "null"]` becomes
// `type: T, nullable: true`, a numeric `exclusiveMinimum/Maximum` becomes the bound with the 3.0
// boolean, `const` becomes a one-value enum, and the (empty) `webhooks` goes. Anything it does not
// know how to say in 3.0 makes it render the document as 3.1, as it is (slowly).

/** The 3.0 form of a 3.1 document, or null when a construct has no 3.0 equivalent here. */
function as30(doc) {
  let ok = true;
  const visit = (node) => {
    if (Array.isArray(node)) return node.map(visit);
    if (!node || typeof node !== 'object') return node;
    const out = {};
    for (const [k, v] of Object.entries(node)) out[k] = visit(v);
    if (Array.isArray(out.type)) {
      const types = out.type.filter((t) => t !== 'null');
      if (types.length !== 1) ok = false;
      else {
        out.type = types[0];
        if (types.length < node.type.length) out.nullable = true;
      }
    }
    for (const [bound, plain] of [
      ['exclusiveMinimum', 'minimum'],
      ['exclusiveMaximum', 'maximum'],
    ]) {
      if (typeof out[bound] === 'number') {
        if (plain in out) ok = false;
        out[plain] = out[bound];
        out[bound] = true;
      }
    }
    if ('const' in out) {
      out.enum = [out.const];
      delete out.const;
    }
    if (out.type === 'null') ok = false;
    for (const k of ['prefixItems', '$schema', 'if', 'then', 'else', 'unevaluatedProperties', 'dependentSchemas', 'contentEncoding']) if (k in out) ok = false;
    return out;
  };
  const { webhooks, ...rest } = doc;
  if (webhooks && Object.keys(webhooks).length > 0) return null;
  if (rest.jsonSchemaDialect) return null;
  const paths = visit(rest.paths);
  const components = visit(rest.components);
  if (!ok) return null;
  return { ...rest, openapi: '3.0.3', paths, components };
}

/** Swagger UI's bundle (the page preloads it): run once the outline has been painted. */
function loadBundle() {
  return new Promise((resolve, reject) => {
    const s = document.createElement('script');
    s.src = document.querySelector('link[rel="preload"][as="script"]').href;
    s.onload = resolve;
    s.onerror = () => reject(new Error("Swagger UI's script could not be loaded"));
    document.body.append(s);
  });
}

function render(spec) {
  window.ui = window.SwaggerUIBundle({
    spec,
    dom_id: '#swagger-ui',
    deepLinking: true,
    validatorUrl: null,
    tryItOutEnabled: false,
    persistAuthorization: false,
    // Tags folded (a click, or a #/<tag> link, opens one): laying out all 85 operations at once
    // costs another 0.3–0.4 s.
    docExpansion: 'none',
    // The outline the page opened with (api/docs-outline.ts) has done its part.
    onComplete: () => document.getElementById('sap-docs-outline')?.remove(),
  });
}

// The page shows the outline first; compiling Swagger UI's bundle (about a second) waits until the
// browser has painted it (the next frame, then a task).
const painted = new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
// Already on its way: index.html preloads it.
const spec = fetch('/openapi.json').then((r) => {
  if (!r.ok) throw new Error(`GET /openapi.json: ${r.status}`);
  return r.json();
});
Promise.all([spec, painted.then(loadBundle)])
  .then(([doc]) => render(as30(doc) ?? doc))
  .catch((e) => {
    const p = document.createElement('p');
    p.className = 'sap-docs-error';
    p.textContent = `The interactive reference could not be loaded: ${e.message}`;
    document.getElementById('swagger-ui').append(p);
  });
