from django.urls import path

from delayqueue.api import views

API = "camellia/delayQueue/"

urlpatterns = [
    path(API + "sendMsg", views.SendMsgView.as_view()),
    path(API + "sendMsgBatch", views.SendMsgBatchView.as_view()),
    path(API + "pullMsg", views.PullMsgView.as_view()),
    path(API + "longPollingMsg", views.LongPollingMsgView.as_view()),
    path(API + "ackMsg", views.AckMsgView.as_view()),
    path(API + "getMsg", views.GetMsgView.as_view()),
    path(API + "deleteMsg", views.DeleteMsgView.as_view()),
    path(API + "getMonitorData", views.GetMonitorDataView.as_view()),
    path(API + "getTopicInfo", views.GetTopicInfoView.as_view()),
    path(API + "getTopicInfoList", views.GetTopicInfoListView.as_view()),
    path(API + "restore", views.RestoreView.as_view()),
    path(API + "restoreMsg", views.RestoreMsgView.as_view()),
]

HEALTH = "camellia/health/"

urlpatterns += [
    path(HEALTH + "status", views.HealthStatusView.as_view()),
    path(HEALTH + "check", views.HealthCheckView.as_view()),
    path(HEALTH + "online", views.HealthOnlineView.as_view()),
    path(HEALTH + "offline", views.HealthOfflineView.as_view()),
]
