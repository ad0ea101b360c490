FROM node:20-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap util-linux python3 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY . .
# The sandbox host's init helper (see tools/sandbox-init); without it sandboxes start through sh + mount.
RUN mkdir -p .tools/bin && rm -f .tools/bin/sap-sandbox-init && cc -O2 -Wall -o .tools/bin/sap-sandbox-init tools/sandbox-init/sandbox-init.c
RUN npm run build
