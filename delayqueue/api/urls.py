from django.urls import path

from delayqueue.api.views import health, messages, recovery, schedules, topics

# camellia's paths, each served by one view.
ENDPOINTS = {
    "camellia/delayQueue/": {
        "sendMsg": messages.SendMsgView, "sendMsgBatch": messages.SendMsgBatchView, "pullMsg": messages.PullMsgView,
        "longPollingMsg": messages.LongPollingMsgView, "ackMsg": messages.AckMsgView, "getMsg": messages.GetMsgView,
        "deleteMsg": messages.DeleteMsgView, "getMonitorData": topics.GetMonitorDataView,
        "getTopicInfo": topics.GetTopicInfoView, "getTopicInfoList": topics.GetTopicInfoListView,
        "restore": recovery.RestoreView, "restoreMsg": recovery.RestoreMsgView,
        "getTopicConfig": topics.GetTopicConfigView, "setTopicConfig": topics.SetTopicConfigView,
        "pauseTopic": topics.PauseTopicView, "resumeTopic": topics.ResumeTopicView, "purgeTopic": topics.PurgeTopicView,
        "getDeadMsgList": recovery.GetDeadMsgListView, "redriveDeadMsg": recovery.RedriveDeadMsgView,
        "getRedriveTask": recovery.GetRedriveTaskView, "purgeDeadMsg": recovery.PurgeDeadMsgView,
        "ackMsgBatch": messages.AckMsgBatchView, "touchMsg": messages.TouchMsgView,
        "rescheduleMsg": messages.RescheduleMsgView,
        "createSchedule": schedules.CreateScheduleView, "getSchedule": schedules.GetScheduleView,
        "listSchedules": schedules.ListSchedulesView, "updateSchedule": schedules.UpdateScheduleView,
        "pauseSchedule": schedules.PauseScheduleView, "resumeSchedule": schedules.ResumeScheduleView,
        "deleteSchedule": schedules.DeleteScheduleView,
    },
    "camellia/health/": {
        "status": health.HealthStatusView, "check": health.HealthCheckView, "online": health.HealthOnlineView,
        "offline": health.HealthOfflineView,
    },
}

urlpatterns = [path(base + name, view.as_view()) for base, views_by_name in ENDPOINTS.items()
               for name, view in views_by_name.items()]
