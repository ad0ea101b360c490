/**
 * How the host serves the routes of its wire contract (../host-contract/wire.ts): each at its declared
 * method and path, its request validated with its declared schema first (a bad request is a
 * SandboxError `invalid_request`, answered 400 by the app's error handler).
 */
import type express from 'express';
import type { NextFunction, Request, Response } from 'express';
import type { z } from 'zod';
import { SandboxError } from '../../contract/errors';
import type { HostMethod, HostRoute, RouteInput } from '../host-contract/wire';

/** Parses `{ params, query, body }` of a request with a route's schema; throws invalid_request. */
export function parse<S extends z.ZodType>(schema: S, req: Request): z.output<S> {
  const r = schema.safeParse({ params: req.params, query: req.query, body: req.body });
  if (!r.success) {
    const msg = r.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ');
    throw new SandboxError('invalid_request', msg);
  }
  return r.data;
}

/** A route's handler: gets the validated request; what it throws (or rejects with) goes to the app's error handler. */
export type RouteHandler<R extends HostRoute> = (input: RouteInput<R>, res: Response, req: Request) => Promise<void>;

/** Registers a declared route's handler on the app. */
export type Serve = <R extends HostRoute>(route: R, handler: RouteHandler<R>) => void;

const EXPRESS_METHOD: Record<HostMethod, 'get' | 'post' | 'put' | 'delete'> = { GET: 'get', POST: 'post', PUT: 'put', DELETE: 'delete' };

/** The Serve of an app: `app.get(route.path, …)` (or post, put, delete) with the route's parse first. */
export function serveOn(app: express.Express): Serve {
  return function serve<R extends HostRoute>(route: R, handler: RouteHandler<R>): void {
    app.route(route.path)[EXPRESS_METHOD[route.method]]((req: Request, res: Response, next: NextFunction) => {
      let input: RouteInput<R>;
      try {
        input = parse<R['request']>(route.request, req);
      } catch (err) {
        next(err);
        return;
      }
      handler(input, res, req).catch(next);
    });
  };
}
