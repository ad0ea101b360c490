import type { NextFunction, Request, Response } from 'express';

/**
 * The CSP of every answer that is not one of the console's or the reference's pages (api/console.ts
 * sets theirs over it): nothing loads, nothing frames it, and a document made of it runs in an opaque
 * origin. The API's answers are data, and some carry bytes a sandbox wrote (files, logs, results).
 */
export const DATA_CSP = "default-src 'none'; frame-ancestors 'none'; sandbox";

/**
 * Headers of every answer of the API, set first (the console's pages replace the CSP with theirs).
 * `nosniff`: a browser takes each answer as the type it is sent with, so a file a sandbox wrote
 * (application/octet-stream), a log (text/plain) or a result (application/json) is never run as the
 * console's script by `<script src>` (which `script-src 'self'` would otherwise admit) nor sniffed into
 * HTML; the CSP makes one opened as a page inert. See docs/threat-model.md, "The console's origin".
 */
export function dataAnswerHeaders(_req: Request, res: Response, next: NextFunction): void {
  res.setHeader('X-Content-Type-Options', 'nosniff');
  res.setHeader('Content-Security-Policy', DATA_CSP);
  next();
}
