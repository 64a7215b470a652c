# One image for every role of mailroom (api, worker, migrate): the command picks the role.
FROM node:20-slim

WORKDIR /app
ENV NODE_ENV=production

# Dependencies first, so a change of the sources does not reinstall them. tsx is a runtime
# dependency: the services run their TypeScript sources directly, as `npm start` does.
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund && npm cache clean --force

COPY tsconfig.json ./
COPY src ./src
RUN mkdir -p data && chown node:node data

USER node
EXPOSE 3000
CMD ["npm", "run", "start:api"]
