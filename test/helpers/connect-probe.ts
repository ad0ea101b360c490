/**
 * A python3 script for a sandbox: for each "host:port" argument it connects and prints one JSON
 * object {"host:port": outcome}. The outcome is "connected" (or, with --http first, "body:" and the
 * body of an HTTP GET), "timeout" after 10 s (a refusal must never look like that), or the errno
 * name of the failure (ECONNREFUSED, EHOSTUNREACH…), or "dns:" and getaddrinfo's code when a name
 * did not resolve.
 */
export const CONNECT_PROBE = `
import errno, json, socket, sys
args = sys.argv[1:]
http = bool(args) and args[0] == "--http"
out = {}
for target in args[1:] if http else args:
    host, port = target.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.connect((host, int(port)))
        if http:
            s.sendall(b"GET / HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n")
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk: break
                data += chunk
            out[target] = "body:" + data.split(b"\\r\\n\\r\\n", 1)[-1].decode()
        else:
            out[target] = "connected"
    except socket.timeout:
        out[target] = "timeout"
    except socket.gaierror as e:
        out[target] = "dns:" + str(e.errno)
    except OSError as e:
        out[target] = errno.errorcode.get(e.errno, str(e.errno))
    finally:
        s.close()
print(json.dumps(out))
`;
