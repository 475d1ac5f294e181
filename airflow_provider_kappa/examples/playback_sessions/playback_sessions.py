"""The sessionizer: an account's playback events form a session until 5 minutes pass
without one; a session is emitted once the watermark passes its end."""

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_provider_kappa.spark import read_source, write_sink

spark = SparkSession.builder.getOrCreate()

plays = read_source(spark, "playbacks").withWatermark("event_ts", "10 minutes")

sessions = (
    plays.groupBy("account_id", F.session_window("event_ts", "5 minutes"))
    .agg(F.count(F.lit(1)).alias("plays"), F.max("event_ts").alias("last_play_ts"))
    .select(
        "account_id",
        F.col("session_window.start").alias("session_start"),
        F.col("session_window.end").alias("session_end"),
        "plays",
        "last_play_ts",
    )
)

write_sink(sessions, "sessions").awaitTermination()
