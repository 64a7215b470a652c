import type { DeliveryFeedback } from '../outcomes/provider-events.js';

/**
 * Amazon SES notifications, the `Message` of an SNS Notification (docs/outcomes.md). Both
 * shapes SES publishes are read: feedback notifications (`notificationType`) and event
 * publishing through a configuration set (`eventType`). Bounce: Permanent = hard,
 * Transient (and Undetermined) = soft; Complaint, unless its `complaintFeedbackType` (the ISP's
 * ARF Feedback-Type) is one other than `abuse`, as a report by mail (`not-spam`: the recipient
 * says it is not spam); Delivery; DeliveryDelay.
 */
interface SesMail {
  messageId?: string;
  headers?: { name?: string; value?: string }[];
  commonHeaders?: { messageId?: string };
}
interface SesNotification {
  notificationType?: string;
  eventType?: string;
  mail?: SesMail;
  bounce?: { bounceType?: string; bounceSubType?: string; bouncedRecipients?: { diagnosticCode?: string; status?: string }[] };
  deliveryDelay?: { delayType?: string; delayedRecipients?: { diagnosticCode?: string }[] };
  /** `complaintFeedbackType`: the ISP's ARF `Feedback-Type`, when it sent one. */
  complaint?: { complaintFeedbackType?: string };
}

/** The Message-ID the sender set, when SES kept the original headers. */
function originalMessageId(mail: SesMail): string | undefined {
  const header = mail.headers?.find((h) => h.name?.toLowerCase() === 'message-id')?.value;
  return header ?? mail.commonHeaders?.messageId;
}

export function sesFeedback(message: string): DeliveryFeedback[] {
  let notification: SesNotification;
  try {
    notification = JSON.parse(message) as SesNotification;
  } catch {
    // A notification that is not an SES event (a test message published to the topic).
    return [];
  }
  if (!notification || typeof notification !== 'object' || !notification.mail) return [];
  const kind = notification.notificationType ?? notification.eventType;
  const match = { messageId: originalMessageId(notification.mail), providerMessageId: notification.mail.messageId };
  switch (kind) {
    case 'Bounce': {
      const recipient = notification.bounce?.bouncedRecipients?.[0];
      const diagnostic = recipient?.diagnosticCode ?? recipient?.status ?? notification.bounce?.bounceSubType;
      const bounceType = notification.bounce?.bounceType === 'Permanent' ? 'hard' : 'soft';
      return [{ type: 'bounced', ...match, bounceType, diagnostic }];
    }
    case 'Complaint': {
      const feedbackType = notification.complaint?.complaintFeedbackType?.toLowerCase();
      return feedbackType === undefined || feedbackType === 'abuse' ? [{ type: 'complained', ...match }] : [];
    }
    case 'Delivery':
      return [{ type: 'delivered', ...match }];
    case 'DeliveryDelay':
      return [{ type: 'delivery_delayed', ...match, diagnostic: notification.deliveryDelay?.delayedRecipients?.[0]?.diagnosticCode ?? notification.deliveryDelay?.delayType }];
    default:
      return [];
  }
}
