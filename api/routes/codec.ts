import type { NextFunction, Request, Response } from 'express';
import { publicBase, type RouteTable } from '../http';
import { hashSecret } from '../../lib/ids';
import { invalid } from '../../contract/errors';
import type { CodecService } from '../../services/codec';
import { Payloads, TokenParams, CodecLink } from '../../contract/codec';

/**
 * The Temporal UI's codec endpoint (docs/threat-model.md, "Payloads per organisation"):
 * - POST /codec/decode with X-API-Key (tools, scripts);
 * - POST /api/codec/link: a signed endpoint for the caller's key, `<api>/codec/<token>`, to paste in
 *   the UI's codec setting (a browser cannot send X-API-Key from the UI); the UI then calls
 *   POST /codec/<token>/decode.
 * A payload opens only for its organisation's keys (an operator's: the platform's payloads too).
 */
export function registerCodecRoutes(t: RouteTable, codec: CodecService, cfg: { PUBLIC_API_URL?: string | undefined; PORT: number }): void {
  t.add({
    method: 'post',
    path: '/codec/decode',
    tag: 'codec',
    summary: "Decodes Temporal payloads of the caller's organisation (the Temporal UI's codec endpoint); others come back as sent",
    body: Payloads,
    responses: { 200: { description: 'The payloads, opened where the key may', schema: Payloads } },
    handler: ({ org, body, res }) => {
      res.json({ payloads: codec.decode(org, body.payloads) });
    },
  });
  t.add({
    method: 'post',
    path: '/api/codec/link',
    tag: 'codec',
    summary: "A signed codec endpoint for this key, for the Temporal UI's codec setting (valid 12 h; revoking the key ends it)",
    responses: { 201: { description: 'The endpoint', schema: CodecLink } },
    handler: ({ org, req, res }) => {
      const key = req.headers['x-api-key'];
      if (typeof key !== 'string') throw invalid('send the key in the X-API-Key header to make a codec link');
      const { token, expiresAt } = codec.link(org, hashSecret(key));
      res.status(201).json({ endpoint: `${publicBase({ cfg }, req)}/codec/${token}`, expiresAt });
    },
  });
  t.add({
    method: 'post',
    path: '/codec/:token/decode',
    tag: 'codec',
    summary: 'Decodes Temporal payloads through a signed codec link (POST /api/codec/link)',
    public: true,
    params: TokenParams,
    body: Payloads,
    responses: { 200: { description: 'The payloads, opened where the link may', schema: Payloads } },
    handler: async ({ params, body, res }) => {
      const caller = await codec.callerOfLink(params.token);
      res.json({ payloads: codec.decode(caller, body.payloads) });
    },
  });
}

/**
 * CORS for the codec endpoint only, and only for `origins` (the Temporal UI's): its preflight and its
 * answers. Any other origin gets no CORS header, so a browser keeps the answer from its page.
 */
export function codecCors(origins: string[]) {
  const allowed = new Set(origins.map((o) => o.replace(/\/+$/, '')));
  return (req: Request, res: Response, next: NextFunction): void => {
    if (!req.path.startsWith('/codec/')) return next();
    const origin = req.headers.origin;
    if (origin && allowed.has(origin)) {
      res.setHeader('access-control-allow-origin', origin);
      res.setHeader('access-control-allow-credentials', 'true');
      res.setHeader('access-control-allow-methods', 'POST, OPTIONS');
      res.setHeader('access-control-allow-headers', 'content-type, x-namespace, x-api-key, authorization');
      res.setHeader('access-control-max-age', '600');
    }
    res.setHeader('vary', 'Origin');
    if (req.method === 'OPTIONS') {
      res.status(204).end();
      return;
    }
    next();
  };
}
