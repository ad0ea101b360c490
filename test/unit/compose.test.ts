/**
 * docker-compose.yml publishes only what users need: the API (and a preview port, if one is
 * configured), bound to loopback unless API_BIND says otherwise. Temporal, its UI, MongoDB, FerretDB
 * and PostgreSQL have no authentication of their own and stay on the compose network.
 */
import fs from 'node:fs';
import path from 'node:path';
import { parse } from 'yaml';

const ROOT = path.join(__dirname, '..', '..');

interface Service {
  command?: string[];
  environment?: Record<string, string>;
  ports?: (string | { target: number; published?: string | number; host_ip?: string })[];
}

/** `${NAME:-default}` and `${NAME}` as compose reads them with `env`. */
function interpolate(text: string, env: Record<string, string>): string {
  return text.replace(/\$\{(\w+)(?::-([^}]*))?\}/g, (_m, name: string, def?: string) => env[name] || def || '');
}

function services(env: Record<string, string> = {}): Record<string, Service> {
  const raw = fs.readFileSync(path.join(ROOT, 'docker-compose.yml'), 'utf8');
  return (parse(interpolate(raw, env), { merge: true }) as { services: Record<string, Service> }).services;
}

/** One published port: the address it is bound to on the machine ('' = every interface) and the container port. */
function published(svc: Service): { hostIp: string; target: number; raw: string }[] {
  return (svc.ports ?? []).map((p) => {
    if (typeof p === 'object') return { hostIp: p.host_ip ?? '', target: Number(p.target), raw: JSON.stringify(p) };
    const parts = String(p).split(':');
    // host_ip:published:target | published:target | target
    const hostIp = parts.length === 3 ? parts[0]! : '';
    return { hostIp, target: Number(parts[parts.length - 1]!.split('/')[0]), raw: String(p) };
  });
}

const isApi = (svc: Service): boolean => (svc.command ?? []).includes('dist/api/main.js');

describe('docker-compose.yml', () => {
  it('publishes the API port (and a preview port) of the API services only, and nothing else', () => {
    const all = services();
    const found: string[] = [];
    for (const [name, svc] of Object.entries(all)) {
      for (const p of published(svc)) {
        found.push(name);
        // Only the API process answers users; every other server here has no authentication of its own.
        expect({ name, port: p.raw, api: isApi(svc) }).toEqual({ name, port: p.raw, api: true });
        // A published port must be one the API listens on: its PORT, or its PREVIEW_PORT.
        const env = svc.environment ?? {};
        const needed = [env.PORT, env.PREVIEW_PORT].filter(Boolean).map(Number);
        expect({ name, target: p.target, needed: needed.includes(p.target) }).toEqual({ name, target: p.target, needed: true });
      }
    }
    // The API is published (the stack would be of no use otherwise).
    expect(found).toContain('api');
  });

  it('binds published ports to loopback by default, and to API_BIND when it is set', () => {
    for (const [name, svc] of Object.entries(services()))
      for (const p of published(svc)) expect({ name, hostIp: p.hostIp }).toEqual({ name, hostIp: '127.0.0.1' });
    for (const [name, svc] of Object.entries(services({ API_BIND: '0.0.0.0' })))
      for (const p of published(svc)) expect({ name, hostIp: p.hostIp }).toEqual({ name, hostIp: '0.0.0.0' });
  });

  it('gives the API processes the secrets whose published defaults they refuse outside development', () => {
    const all = services();
    for (const name of ['api', 'api-2']) {
      const env = all[name]!.environment ?? {};
      expect(Object.keys(env)).toEqual(expect.arrayContaining(['API_KEY', 'HOST_TOKEN', 'POSTGRES_PASSWORD', 'NODE_ENV']));
    }
  });
});
