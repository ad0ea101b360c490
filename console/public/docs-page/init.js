// Renders /openapi.json with Swagger UI (its files served by the API from node_modules/swagger-ui-dist).
// "Try it out" sends the key given in Authorize as X-API-Key; Swagger UI keeps it in this page only.
window.ui = window.SwaggerUIBundle({
  url: '/openapi.json',
  dom_id: '#swagger-ui',
  deepLinking: true,
  validatorUrl: null,
  tryItOutEnabled: false,
  persistAuthorization: false,
});
