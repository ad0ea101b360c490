FROM node:20-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends util-linux python3 gcc libc6-dev libseccomp-dev nftables iproute2 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY . .
# The sandbox host's C helpers (tools/sandbox-init, tools/sandbox-enter) and the sandbox's seccomp
# filter (tools/sandbox-seccomp): sandboxes cannot start without them.
RUN mkdir -p .tools/bin .tools/lib \
 && cc -O2 -Wall -o .tools/bin/sap-sandbox-init tools/sandbox-init/sandbox-init.c \
 && cc -O2 -Wall -o .tools/bin/sap-sandbox-enter tools/sandbox-enter/sandbox-enter.c \
 && cc -O2 -Wall -o .tools/bin/sap-seccomp-gen tools/sandbox-seccomp/seccomp-gen.c -l:libseccomp.a \
 && .tools/bin/sap-seccomp-gen .tools/lib/sap-seccomp.bpf
# The Claude Agent SDK that every sandbox sees read-only at /opt/sap/node_modules (as in scripts/toolchain.sh).
RUN mkdir -p .tools/agent-sdk/opt/sap \
 && cp sandbox/agent-sdk/package.json sandbox/agent-sdk/package-lock.json .tools/agent-sdk/opt/sap/ \
 && cd .tools/agent-sdk/opt/sap && npm ci --omit=dev --no-audit --no-fund \
 && chmod -R u=rwX,go=rX /app/.tools/agent-sdk
RUN npm run build
