from django.urls import path

from webhooks import views

app_name = "webhooks"

urlpatterns = [
    path("github/", views.github, name="github"),
    path("gitlab/", views.gitlab, name="gitlab"),
]
