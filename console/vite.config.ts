import { defineConfig } from 'vite';
import path from 'node:path';

// The web console: console/index.html and console/src → dist/console (hashed assets under assets/),
// served by the API at /console (api/console.ts). public/ (the /docs page) is copied as is.
export default defineConfig({
  root: __dirname,
  base: '/console/',
  logLevel: 'warn',
  build: {
    outDir: path.join(__dirname, '..', 'dist', 'console'),
    emptyOutDir: true,
    target: 'es2022',
    sourcemap: false,
    reportCompressedSize: false,
    // One small app: no inline scripts (the CSP allows scripts from the origin only).
    assetsInlineLimit: 0,
    modulePreload: { polyfill: false },
  },
});
