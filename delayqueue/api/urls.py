from django.urls import path

from delayqueue.api import views

# camellia's paths, each served by one view.
ENDPOINTS = {
    "camellia/delayQueue/": {
        "sendMsg": views.SendMsgView, "sendMsgBatch": views.SendMsgBatchView, "pullMsg": views.PullMsgView,
        "longPollingMsg": views.LongPollingMsgView, "ackMsg": views.AckMsgView, "getMsg": views.GetMsgView,
        "deleteMsg": views.DeleteMsgView, "getMonitorData": views.GetMonitorDataView,
        "getTopicInfo": views.GetTopicInfoView, "getTopicInfoList": views.GetTopicInfoListView,
        "restore": views.RestoreView, "restoreMsg": views.RestoreMsgView,
        "getTopicConfig": views.GetTopicConfigView, "setTopicConfig": views.SetTopicConfigView,
        "pauseTopic": views.PauseTopicView, "resumeTopic": views.ResumeTopicView, "purgeTopic": views.PurgeTopicView,
        "getDeadMsgList": views.GetDeadMsgListView, "redriveDeadMsg": views.RedriveDeadMsgView,
        "getRedriveTask": views.GetRedriveTaskView, "purgeDeadMsg": views.PurgeDeadMsgView,
        "ackMsgBatch": views.AckMsgBatchView, "touchMsg": views.TouchMsgView,
        "rescheduleMsg": views.RescheduleMsgView,
    },
    "camellia/health/": {
        "status": views.HealthStatusView, "check": views.HealthCheckView, "online": views.HealthOnlineView,
        "offline": views.HealthOfflineView,
    },
}

urlpatterns = [path(base + name, view.as_view()) for base, views_by_name in ENDPOINTS.items()
               for name, view in views_by_name.items()]
