# One image for every role of mailroom (api, worker, inbound, smtp, migrate): the command
# picks the role (node dist/api/server.js, dist/workers/main.js, dist/inbound/main.js,
# dist/smtp/main.js, dist/cli/main.js migrate).
# Multi-stage: TypeScript is compiled in the build stage; the final image holds the compiled
# JavaScript (dist/) and the production dependencies only, no TypeScript tooling.
# Node.js 24 is the Active LTS line (supported until April 2028).
ARG NODE_IMAGE=node:24.11-bookworm-slim

# Production dependencies only.
FROM ${NODE_IMAGE} AS deps
WORKDIR /app
COPY package.json package-lock.json ./
COPY scripts ./scripts
RUN npm ci --omit=dev --no-audit --no-fund && npm cache clean --force

# Every dependency, and the build.
FROM ${NODE_IMAGE} AS build
WORKDIR /app
COPY package.json package-lock.json ./
COPY scripts ./scripts
RUN npm ci --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
RUN npm run build

FROM ${NODE_IMAGE}
WORKDIR /app
ENV NODE_ENV=production
COPY --from=deps /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
COPY package.json package-lock.json ./
COPY scripts ./scripts
RUN mkdir -p data && chown node:node data
USER node
EXPOSE 3000 2525 2587
# node itself (not npm) is the process: it receives SIGTERM and shuts down gracefully.
CMD ["node", "dist/api/server.js"]
