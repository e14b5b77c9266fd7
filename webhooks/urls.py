from django.urls import path

from webhooks import views

app_name = "webhooks"

urlpatterns = [
    path("github/", views.github, name="github"),
    path("gitlab/", views.gitlab, name="gitlab"),
    # A repository with its own webhook secret is configured with its own URL, so the
    # secret is known before the body is read.
    path("github/<int:repository_id>/", views.github, name="github_repository"),
    path("gitlab/<int:repository_id>/", views.gitlab, name="gitlab_repository"),
]
