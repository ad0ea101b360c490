/**
 * Tells an outage of a backing service (MongoDB, Temporal, a socket) from a bug: `unreachableService`.
 */
/** Errors of the MongoDB driver that mean the database cannot be reached (not that a query was wrong). */
const MONGO_UNREACHABLE = new Set([
  'MongoNetworkError',
  'MongoNetworkTimeoutError',
  'MongoServerSelectionError',
  'MongoNotConnectedError',
  'MongoTopologyClosedError',
  'MongoPoolClearedError',
  'MongoServerClosedError',
]);
/**
 * FerretDB answers a command it cannot run because its own backend (PostgreSQL in the production
 * profile) is out of reach with MongoDB's InternalError (code 1), naming the backend's failure in the
 * message: these are the failures to connect or a connection cut by a restart, not a wrong query.
 */
const FERRETDB_BACKEND_UNREACHABLE =
  /failed to connect to|conn closed|connection refused|connection reset by peer|unexpected EOF|the database system is (starting up|shutting down|in recovery mode)|SQLSTATE 57P0[1-3]|SQLSTATE 08/;
/** gRPC status codes of a Temporal call that found no server: UNAVAILABLE, DEADLINE_EXCEEDED. */
const GRPC_UNREACHABLE = new Set([14, 4]);
/** Socket errors of a call to a service (the sandbox host, or a driver's own socket). */
const SOCKET_UNREACHABLE = new Set(['ECONNREFUSED', 'ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH', 'UND_ERR_SOCKET', 'UND_ERR_CONNECT_TIMEOUT']);

/**
 * Which backing service an error says is out of reach ('MongoDB', 'Temporal', 'a backing service'),
 * or null when it is some other failure. Follows `cause` chains: drivers wrap socket errors.
 * Such a failure is an outage (503, retry later), not a bug (500).
 */
export function unreachableService(err: unknown): string | null {
  for (
    let e = err as { name?: string; code?: unknown; cause?: unknown } | undefined, depth = 0;
    e && typeof e === 'object' && depth < 8;
    e = e.cause as typeof e, depth++
  ) {
    if (e.name && MONGO_UNREACHABLE.has(e.name)) return 'MongoDB';
    if (e.name === 'MongoServerError' && e.code === 1 && FERRETDB_BACKEND_UNREACHABLE.test(String((e as { message?: unknown }).message))) return 'MongoDB';
    // A gRPC error (Temporal's client wraps it in a ServiceError): a number code and metadata.
    if (typeof e.code === 'number' && GRPC_UNREACHABLE.has(e.code) && 'metadata' in e) return 'Temporal';
    if (typeof e.code === 'string' && SOCKET_UNREACHABLE.has(e.code)) return 'a backing service';
  }
  return null;
}
