/**
 * The few domain errors the service raises. The API's error handler maps each one to the
 * spec's body `{ name, message, statusCode, details? }`; nothing else reaches a client.
 */
export interface ErrorDetail {
  path: string;
  message: string;
}

export class AppError extends Error {
  constructor(
    readonly statusCode: number,
    readonly errorName: string,
    message: string,
    readonly details?: ErrorDetail[],
    /** Response headers the answer carries (a limit's Retry-After and RateLimit-*). */
    readonly headers?: Record<string, string>,
  ) {
    super(message);
    this.name = 'AppError';
  }
}

export class ValidationError extends AppError {
  /** 422 by default; the spec asks for 400 on campaign send and event create. */
  constructor(message: string, details?: ErrorDetail[], statusCode = 422) {
    super(statusCode, 'validation_error', message, details);
  }
}

export class NotFoundError extends AppError {
  constructor(message = 'Not found') {
    super(404, 'not_found', message);
  }
}

export class PermissionError extends AppError {
  constructor(message: string, errorName = 'missing_permission') {
    super(403, errorName, message);
  }
}

export class AuthenticationError extends AppError {
  constructor(
    message = 'Missing or invalid API key',
    /** RFC 6750: no credentials at all (`missing`) or a bearer token that is not valid. */
    readonly reason: 'missing' | 'invalid_token' = 'missing',
  ) {
    super(401, 'missing_api_key', message);
  }
}

export class ConflictError extends AppError {
  constructor(errorName: string, message: string) {
    super(409, errorName, message);
  }
}

export class ServiceUnavailableError extends AppError {
  constructor(message = 'A dependency of the service is unavailable; try again shortly') {
    super(503, 'service_unavailable', message);
  }
}
