import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import net from 'node:net';
import { eventually } from './env';

/*
 * Test hosts: network namespaces of their own on this machine, each with one address from
 * 198.18.0.0/15 (the range reserved for such tests) or 169.254.0.0/16 (to check that link-local is
 * refused), reached through a veth from the host. Tests send traffic only to these and to loopback.
 * Callers remove() every host they make (afterAll), also when a test fails.
 */

/**
 * A Python HTTP server on addr:port with the request handler `name` that `handler` defines. Python's
 * HTTPServer asks for the name of its own address when it binds (socket.getfqdn); a test host has no
 * resolver that answers, so that lookup alone would wait out the resolver's timeouts (about 10 s per
 * server). This one binds without it (the name is only used in CGI variables).
 */
function pythonServer(addr: string, port: number, handler: string, name: string, base = 'HTTPServer'): string {
  return `import http.server, socketserver
${handler}
class S(http.server.${base}):
    def server_bind(self):
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "${addr}", ${port}
S(("${addr}", ${port}), ${name}).serve_forever()`;
}

/**
 * Puts on `hostIf` the host's end of a /30 that no other interface of this machine holds, and answers
 * both ends. The kernel takes an address in a /30 already on another link without a word, and routes
 * the /30 to the older link: a test host's address would then reach the other's server (every one
 * serves on port 8080), and listening() would pass on it. Every test host (of this file, of the other
 * jest worker, or left by a killed run) holds its /30 on the host's side, so: add ours, then look; two
 * that took the same /30 at the same moment both see the other, and both let go and pick again.
 */
function claimNet(prefix: string, hostIf: string, ip: (...args: string[]) => string): { hostAddr: string; addr: string } {
  const held = (net: string) => ip('-4', '-o', 'addr', 'show', 'to', `${net}/30`).split('\n').filter(Boolean).length;
  for (let attempt = 0; attempt < 100; attempt++) {
    const third = 1 + Math.floor(Math.random() * 250);
    const quad = 4 * Math.floor(Math.random() * 60);
    const at = (n: number) => `${prefix}.${third}.${quad + n}`;
    if (held(at(0)) > 0) continue;
    ip('addr', 'add', `${at(1)}/30`, 'dev', hostIf);
    if (held(at(0)) === 1) return { hostAddr: at(1), addr: at(2) };
    ip('addr', 'del', `${at(1)}/30`, 'dev', hostIf);
  }
  throw new Error(`no free /30 in ${prefix}.0.0/16 for a test host`);
}

/** A network namespace with one address (`addr`) reached through a veth from the host, serving HTTP on `port`. */
export class TestHost {
  readonly ns: string;
  readonly addr: string;
  /** The host's own end of the link: an address of the host's (on its veth). */
  readonly hostAddr: string;
  readonly port = 8080;
  readonly mark = randomBytes(6).toString('hex');
  private readonly hostIf: string;
  private server: ChildProcess | null = null;
  private readonly children: ChildProcess[] = [];

  constructor(prefix: '198.18' | '169.254') {
    const tag = randomBytes(3).toString('hex');
    // Not `sap…`: a sandbox host's table matches its links by prefix (`sap*` by default), so a test
    // host's link named like that would fall under the rules of any default-named stack on the machine.
    this.ns = `tnh-${tag}`;
    this.hostIf = `tnh${tag}`;
    const ip = (...args: string[]) => execFileSync('ip', args, { stdio: ['ignore', 'pipe', 'pipe'] }).toString();
    try {
      ip('netns', 'add', this.ns);
      ip('link', 'add', this.hostIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', this.ns);
      ({ hostAddr: this.hostAddr, addr: this.addr } = claimNet(prefix, this.hostIf, ip));
      ip('link', 'set', this.hostIf, 'up');
      ip('-n', this.ns, 'addr', 'add', `${this.addr}/30`, 'dev', 'eth0');
      ip('-n', this.ns, 'link', 'set', 'eth0', 'up');
      ip('-n', this.ns, 'link', 'set', 'lo', 'up');
      ip('-n', this.ns, 'route', 'add', 'default', 'via', this.hostAddr);
    } catch (err) {
      this.remove(); // a half-made host leaves nothing behind
      throw err;
    }
  }

  /** Starts the HTTP server (answers every GET with the mark) and waits until it answers from the host. */
  async serve(): Promise<this> {
    const handler = `class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"${this.mark}")
    def log_message(self, *a): pass`;
    this.server = spawn('ip', ['netns', 'exec', this.ns, 'python3', '-c', pythonServer(this.addr, this.port, handler, 'H')], { stdio: 'ignore' });
    await this.listening();
    return this;
  }

  /** Serves the files under `dir` over HTTP (threaded, like `python3 -m http.server`) and waits until it answers; killed by remove(). */
  async serveDirectory(dir: string): Promise<ChildProcess> {
    const handler = `import functools
D = functools.partial(http.server.SimpleHTTPRequestHandler, directory=${JSON.stringify(dir)})`;
    // Its request log (stderr) is not read: ignored, so that it can never fill a pipe and stall the server.
    const child = spawn('ip', ['netns', 'exec', this.ns, 'python3', '-c', pythonServer(this.addr, this.port, handler, 'D', 'ThreadingHTTPServer')], {
      stdio: 'ignore',
    });
    this.children.push(child);
    await this.listening();
    return child;
  }

  /** Waits until something in the test host accepts connections on `port` (default: its HTTP port). */
  async listening(port = this.port): Promise<void> {
    await eventually(
      () =>
        new Promise<boolean>((resolve) => {
          const s = net.connect(port, this.addr, () => {
            s.destroy();
            resolve(true);
          });
          s.once('error', () => resolve(false));
          // A connection attempt that gets no answer at all would wait for the kernel's SYN retries (2 min).
          s.setTimeout(2_000, () => {
            s.destroy();
            resolve(false);
          });
        }),
      20_000,
      100,
    );
  }

  /** Runs a program inside the test host's namespace (killed by remove()). */
  spawn(cmd: string, args: string[]): ChildProcess {
    const child = spawn('ip', ['netns', 'exec', this.ns, cmd, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    this.children.push(child);
    return child;
  }

  remove(): void {
    for (const c of this.children) c.kill('SIGKILL');
    this.server?.kill('SIGKILL');
    try {
      execFileSync('ip', ['netns', 'del', this.ns], { stdio: 'ignore' });
    } catch {
      /* already gone */
    }
    try {
      execFileSync('ip', ['link', 'del', this.hostIf], { stdio: 'ignore' });
    } catch {
      /* went with the namespace */
    }
  }
}
