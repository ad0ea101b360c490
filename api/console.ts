import express from 'express';
import fs from 'node:fs';
import path from 'node:path';

/**
 * The web console (built by `npm run build` into dist/console) at /console, and the API reference at
 * /docs (Swagger UI's own files from node_modules/swagger-ui-dist, rendering /openapi.json). Static
 * files only, served without a key: every API call the console makes sends X-API-Key. Hashed assets
 * are cached for a year, the HTML pages never.
 */
export function registerConsole(app: express.Express): void {
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
  app.get('/docs', secure, page(path.join(root, 'docs-page', 'index.html')));
  app.get('/docs/init.js', secure, page(path.join(root, 'docs-page', 'init.js')));
  // Swagger UI's files are not hashed: cached for an hour, revalidated after.
  app.use('/docs/assets', secure, express.static(swagger, { index: false, maxAge: '1h', redirect: false }));
}
