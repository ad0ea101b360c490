import express from 'express';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import zlib from 'node:zlib';

/** Swagger UI's files the reference page loads, served under a name with their content's hash. */
const DOCS_ASSETS: Record<string, string> = { 'swagger-ui-bundle.js': 'text/javascript; charset=utf-8', 'swagger-ui.css': 'text/css; charset=utf-8' };

/**
 * Serves DOCS_ASSETS of `dir` at `<prefix>/<hash>/<name>`, the hash that of their content: cached
 * for a year and immutable, gzipped once (in memory) for clients that take gzip. Returns the
 * versioned prefix.
 */
function serveDocsAssets(app: express.Express, prefix: string, dir: string, secure: express.RequestHandler): string {
  const hash = createHash('sha256');
  for (const name of Object.keys(DOCS_ASSETS)) hash.update(fs.readFileSync(path.join(dir, name)));
  const versioned = `${prefix}/${hash.digest('hex').slice(0, 12)}`;
  const gzipped = new Map<string, Promise<Buffer>>();
  app.get(`${versioned}/:name`, secure, (req, res, next) => {
    const name = req.params.name!;
    const type = DOCS_ASSETS[name];
    if (!type) return next();
    res.setHeader('Content-Type', type);
    res.setHeader('Cache-Control', 'public, max-age=31536000, immutable');
    res.setHeader('Vary', 'Accept-Encoding');
    if (!req.acceptsEncodings('gzip')) return res.sendFile(path.join(dir, name), { cacheControl: false });
    let gz = gzipped.get(name);
    if (!gz) gzipped.set(name, (gz = fs.promises.readFile(path.join(dir, name)).then((b) => promisify(zlib.gzip)(b, { level: 9 }))));
    gz.then((body) => {
      res.setHeader('Content-Encoding', 'gzip');
      res.end(body);
    }, next);
  });
  return versioned;
}

/**
 * The web console (built by `npm run build` into dist/console) at /console, and the API reference at
 * /docs (Swagger UI's own files from node_modules/swagger-ui-dist, rendering /openapi.json). Static
 * files only, served without a key: every API call the console makes sends X-API-Key. Hashed assets
 * are cached for a year, the HTML pages never.
 */
export function registerConsole(app: express.Express, outline = ''): void {
  const root = path.join(__dirname, '..', 'console');
  const swagger = path.dirname(require.resolve('swagger-ui-dist/package.json'));
  // Scripts and everything else from this origin only. Styles also inline: xterm.js and Swagger UI
  // write <style> elements and style attributes at run time.
  const csp = [
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data:",
    "font-src 'self' data:",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
  ].join('; ');
  const secure: express.RequestHandler = (_req, res, next) => {
    res.setHeader('Content-Security-Policy', csp);
    res.setHeader('X-Content-Type-Options', 'nosniff');
    res.setHeader('X-Frame-Options', 'DENY');
    res.setHeader('Referrer-Policy', 'no-referrer');
    next();
  };
  const page =
    (file: string): express.RequestHandler =>
    (_req, res, next) => {
      if (!fs.existsSync(file)) return next();
      res.setHeader('Cache-Control', 'no-cache');
      res.sendFile(file);
    };
  const immutable = { index: false, fallthrough: true, maxAge: '365d', immutable: true, redirect: false } as const;

  app.get('/', (_req, res) => res.redirect(302, '/console/'));
  // Express matches /console and /console/ alike: the page at /console/ (its assets are relative to it).
  const index = page(path.join(root, 'index.html'));
  app.get('/console', secure, (req, res, next) => (req.path.endsWith('/') ? index(req, res, next) : res.redirect(301, '/console/')));
  app.use('/console/assets', secure, express.static(path.join(root, 'assets'), immutable));
  // The reference page names Swagger UI's files by their content's hash (immutable, gzipped).
  const docsAssets = serveDocsAssets(app, '/docs/assets', swagger, secure);
  const docsPage = path.join(root, 'docs-page', 'index.html');
  app.get('/docs', secure, (_req, res, next) => {
    fs.readFile(docsPage, 'utf8', (err, html) => {
      if (err) return next();
      res.setHeader('Cache-Control', 'no-cache');
      res.type('html').send(html.replaceAll('/docs/assets/', `${docsAssets}/`).replace('<!--sap-docs-outline-->', () => outline));
    });
  });
  app.get('/docs/init.js', secure, page(path.join(root, 'docs-page', 'init.js')));
  // Swagger UI's other files by their own names: cached for an hour, revalidated after.
  app.use('/docs/assets', secure, express.static(swagger, { index: false, maxAge: '1h', redirect: false }));
}
