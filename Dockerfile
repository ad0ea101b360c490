FROM node:20-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap util-linux python3 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY . .
RUN npm run build
