"""The writer API's OpenAPI document: its routes, and the IAM auth API Gateway puts in front
of every one of them (template.yaml: ``DefaultAuthorizer: AWS_IAM``).

API Gateway's OpenAPI extensions say "IAM auth" as an ``apiKey`` scheme in the
``Authorization`` header marked ``x-amazon-apigateway-authtype: awsSigv4``; SAM writes that
scheme, named ``AWS_IAM``, into the API it builds from the template, and so does this
document, as the one requirement of every operation. docs/writers.md shows a signed call.
"""

from aws_lambda_powertools.event_handler.api_gateway import ApiGatewayResolver
from aws_lambda_powertools.event_handler.openapi.models import APIKey, SecurityScheme

SIGV4 = "AWS_IAM"
SECURITY_SCHEMES: dict[str, SecurityScheme] = {
    SIGV4: APIKey.model_validate(
        {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "AWS Signature Version 4 for the service execute-api: IAM auth.",
            "openapi_extensions": {"x-amazon-apigateway-authtype": "awsSigv4"},
        }
    )
}
# Global: every operation requires it, as API Gateway does.
SECURITY: list[dict[str, list[str]]] = [{SIGV4: []}]


def openapi_document(resolver: ApiGatewayResolver) -> str:
    """The OpenAPI 3.1 document of ``resolver``'s routes, as JSON text."""
    return resolver.get_openapi_json_schema(
        title="tally writers",
        version="1.0.0",
        security_schemes=SECURITY_SCHEMES,
        security=SECURITY,
    )
