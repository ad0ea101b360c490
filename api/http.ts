import type { NextFunction, Request, RequestHandler, Response, Router } from 'express';
import { OpenAPIRegistry } from '@asteasolutions/zod-to-openapi';
import { z, type ZodType } from '../contract/zod';
import { ApiError } from '../contract/errors';
import { ErrorBodySchema } from '../contract/schemas';
import type { Authenticator, OrgContext } from './auth';

/** What a handler receives: the parsed (not raw) params, query and body, and the caller's org. */
export interface Ctx<P, Q, B> {
  params: P;
  query: Q;
  body: B;
  org: OrgContext;
  req: Request;
  res: Response;
}

type AnyObject = z.ZodObject<z.ZodRawShape>;

/** One route: its schemas (validated, and published in /openapi.json) and its handler. */
export interface RouteDef<PS extends AnyObject, QS extends AnyObject, BS extends ZodType> {
  method: 'get' | 'post' | 'put' | 'patch' | 'delete';
  /** Express-style path, e.g. `/v1/agents/:agentId`. */
  path: string;
  summary: string;
  tag: string;
  params?: PS;
  query?: QS;
  body?: BS;
  /**
   * The request body is not parsed: the handler streams it from `req` (file uploads). Any content
   * type is accepted; the document names `contentType` with a binary schema.
   */
  rawBody?: { contentType: string; description: string };
  /**
   * No API key: the route authenticates the request itself (signed URLs). Left out of /openapi.json;
   * the handler's `org` is empty (`id` '').
   */
  public?: true;
  /**
   * Operators only: a tenant's key gets 403 forbidden (the fleet's views: hosts, the Temporal UI's
   * address). Documented with the `operator` security requirement.
   */
  operator?: true;
  /** Authenticated like any route but left out of /openapi.json (the calls of the client this server answers 501). */
  undocumented?: true;
  /** Documented success answers: status → schema (or null for no body). */
  responses: Record<number, { description: string; schema?: ZodType; /** default application/json */ contentType?: string }>;
  /** Error types this route may answer with, for the document. */
  errors?: number[];
  handler: (ctx: Ctx<z.infer<PS>, z.infer<QS>, z.infer<BS>>) => Promise<void> | void;
}

/** The API's address as the caller reached it (PUBLIC_API_URL when set), for the URLs it hands out. */
export function publicBase(deps: { cfg: { PUBLIC_API_URL?: string | undefined; PORT: number } }, req: Request): string {
  if (deps.cfg.PUBLIC_API_URL) return deps.cfg.PUBLIC_API_URL.replace(/\/+$/, '');
  const first = (v: string | string[] | undefined) => (Array.isArray(v) ? v[0] : v)?.split(',')[0]?.trim();
  const proto = first(req.headers['x-forwarded-proto']) ?? 'http';
  const host = first(req.headers['x-forwarded-host']) ?? req.headers.host ?? `127.0.0.1:${deps.cfg.PORT}`;
  return `${proto === 'https' ? 'https' : 'http'}://${host}`;
}

/** Formats zod issues as `where: what; …`, naming the field. */
export function describeIssues(where: string, error: z.ZodError): string {
  return error.issues
    .slice(0, 10)
    .map((i) => {
      const at = [where, ...i.path.map(String)].filter(Boolean).join('.');
      return `${at}: ${i.message}`;
    })
    .join('; ');
}

/** Parses `value` with `schema`, or throws a 400 naming each bad field. */
export function parseOrThrow<T extends ZodType>(schema: T, value: unknown, where: string): z.infer<T> {
  const r = schema.safeParse(value);
  if (!r.success) throw new ApiError('invalid_request', describeIssues(where, r.error));
  return r.data;
}

const openapiPath = (p: string): string => p.replace(/:(\w+)/g, '{$1}');

/**
 * Registers routes on an Express router and documents each in an OpenAPI registry, from the
 * same zod schemas, so the document cannot drift from what the server accepts.
 */
export class RouteTable {
  readonly registry = new OpenAPIRegistry();
  /** Method and path pattern of the routes with a raw body (see isRawBody). */
  private readonly raw: { method: string; pattern: RegExp }[] = [];

  constructor(
    private readonly router: Router,
    private readonly auth: Authenticator,
  ) {
    this.registry.register('Error', ErrorBodySchema);
    this.registry.registerComponent('securitySchemes', 'ApiKey', { type: 'apiKey', in: 'header', name: 'X-API-Key' });
  }

  add<PS extends AnyObject, QS extends AnyObject, BS extends ZodType>(def: RouteDef<PS, QS, BS>): void {
    const responses: Record<string, { description: string; content?: Record<string, { schema: ZodType }> }> = {};
    for (const [status, r] of Object.entries(def.responses)) {
      responses[status] = r.schema
        ? { description: r.description, content: { [r.contentType ?? 'application/json']: { schema: r.schema } } }
        : { description: r.description };
    }
    // Any route with a body may also meet the body parser's 413 (too large) and 415 (not JSON).
    for (const status of [
      400,
      401,
      404,
      ...(def.operator ? [403] : []),
      ...(def.body ? [413, 415] : []),
      ...(def.rawBody ? [413] : []),
      ...(def.errors ?? []),
    ]) {
      responses[String(status)] ??= { description: 'Error', content: { 'application/json': { schema: ErrorBodySchema } } };
    }
    if (!def.public && !def.undocumented)
      this.registry.registerPath({
        method: def.method,
        path: openapiPath(def.path),
        summary: def.operator ? `${def.summary} (operator keys only)` : def.summary,
        tags: [def.tag],
        security: [{ ApiKey: [] }],
        request: {
          params: def.params,
          query: def.query,
          body: def.body
            ? { content: { 'application/json': { schema: def.body } } }
            : def.rawBody
              ? { description: def.rawBody.description, content: { [def.rawBody.contentType]: { schema: z.string().openapi({ format: 'binary' }) } } }
              : undefined,
        },
        responses,
      });

    const handler: RequestHandler = async (req: Request, res: Response, next: NextFunction) => {
      try {
        const org: OrgContext = def.public
          ? { id: '', role: 'tenant' }
          : def.operator
            ? await this.auth.authenticateOperator(req)
            : await this.auth.authenticate(req);
        const params = def.params ? parseOrThrow(def.params, req.params, 'path') : {};
        const query = def.query ? parseOrThrow(def.query, req.query, 'query') : {};
        const body = def.body ? parseOrThrow(def.body, req.body ?? {}, 'body') : undefined;
        await def.handler({ params, query, body, org, req, res } as Ctx<z.infer<PS>, z.infer<QS>, z.infer<BS>>);
      } catch (err) {
        next(err);
      }
    };
    this.router[def.method](def.path, handler);
    if (def.rawBody) {
      const pattern = new RegExp('^' + def.path.replace(/[.*+?^${}()|[\]\\]/g, '\\$&').replace(/:(\w+)/g, '[^/]+') + '/?$');
      this.raw.push({ method: def.method.toUpperCase(), pattern });
    }
  }

  /** Whether the request goes to a route that streams its body itself (the body parsers leave it alone). */
  isRawBody(req: Request): boolean {
    return this.raw.some((r) => r.method === req.method && r.pattern.test(req.path));
  }
}
