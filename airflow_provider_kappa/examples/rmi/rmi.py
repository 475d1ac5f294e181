"""RMI: plays attributed to the impression that preceded them, counted per 5-minute window.

A stream-stream join (event-time watermarks, a time-bounded join condition) followed
by a windowed aggregation. The same code runs live and in every backfill slice.
"""

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_provider_kappa.spark import read_source, write_sink

spark = SparkSession.builder.getOrCreate()

impressions = (
    read_source(spark, "impressions")
    .select(
        F.col("account_id").alias("i_account"),
        F.col("show_id").alias("i_show"),
        F.col("event_ts").alias("impression_ts"),
    )
    .withWatermark("impression_ts", "10 minutes")
)
plays = (
    read_source(spark, "playbacks")
    .select(
        F.col("account_id").alias("p_account"),
        F.col("show_id").alias("p_show"),
        F.col("event_ts").alias("play_ts"),
    )
    .withWatermark("play_ts", "10 minutes")
)

attributed = impressions.join(
    plays,
    F.expr(
        "p_account = i_account AND p_show = i_show "
        "AND play_ts >= impression_ts AND play_ts <= impression_ts + INTERVAL 30 MINUTES"
    ),
)

summary = (
    attributed.groupBy(F.window("impression_ts", "5 minutes"), F.col("i_show").alias("show_id"))
    .agg(F.count(F.lit(1)).alias("attributed_plays"))
    .select(
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        "show_id",
        "attributed_plays",
    )
)

write_sink(summary, "summary").awaitTermination()
